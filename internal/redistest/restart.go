// A server started again on its port, empty, as after a crash.

package redistest

// Restart starts a new, empty server (ServerProgram) on the port of s,
// which must have been stopped, with the arguments given, waits until it
// answers PING, and makes s stand for it: s.Stop and the end of the test stop the new process.
// Clients of s reconnect to it as to a server that came back after a crash
// with nothing saved. Call it from the goroutine that owns s.
func (s *Server) Restart(t TB, args ...string) {
	t.Helper()
	if s.cmd.ProcessState == nil {
		t.Fatalf("redistest: Restart of %s, which is still running", s.Addr)
	}
	s.launch(t, args)
}
