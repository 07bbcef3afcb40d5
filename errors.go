package ratelimit

import "strings"

// wrapped says where an error happened, with "ratelimit:" once: its message
// is context, then the last error's own message without the "ratelimit: "
// it may start with, so that a FailClosed error over a circuit-open error
// over a server reads "ratelimit: Redis could not decide (FailClosed):
// 127.0.0.1:6379: circuit open …", not "ratelimit:" three times over. It
// unwraps to every error it was given: a sentinel and the cause.
type wrapped struct {
	context string  // starts with "ratelimit: "
	errs    []error // the last is the cause, whose message follows
}

// wrap returns errs, the last of them the cause, in context.
func wrap(context string, errs ...error) error { return &wrapped{context: context, errs: errs} }

func (w *wrapped) Error() string {
	return w.context + ": " + strings.TrimPrefix(w.errs[len(w.errs)-1].Error(), "ratelimit: ")
}

func (w *wrapped) Unwrap() []error { return w.errs }
