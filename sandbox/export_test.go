package sandbox

// Overrunning reports how many compilations passed their deadline and are
// still running in the background.
func (r *Runtime) Overrunning() int { return int(r.overrun.Load()) }
