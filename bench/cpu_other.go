//go:build !unix

package bench

import "time"

// processCPU reports that this system does not tell the process's CPU time
// here.
func processCPU() (time.Duration, bool) { return 0, false }
