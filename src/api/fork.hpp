// A process forked after the library ran (a pre-forking server, multiprocessing's "fork") can
// call it again. LibTorch's CPU operators, oneDNN and MKL run on GNU OpenMP's thread pool, whose
// worker threads exist in the parent only: a forked child that starts a parallel region with more
// than one thread waits at the pool's barrier for threads that are not there, for ever (plain
// torch does the same). One thread needs no team, so a forked child runs on one CPU thread: a
// fork handler marks the child (all it does: only async-signal-safe work is allowed there), and
// the child's first call into the library sets LibTorch's thread count to 1 (OpenMP, MKL and
// LibTorch's own), as PyTorch's DataLoader does in its forked workers. CUDA cannot be used after a
// fork in any case. Workers that need every core: spawn them instead of forking.
#pragma once

namespace sapiens_seg::api {

// Called first by every entry point that may run LibTorch CPU work (load, prepare, run, resize).
void settle_after_fork();

}  // namespace sapiens_seg::api
