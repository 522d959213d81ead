// Writing to a socket whose peer is gone raises SIGPIPE, whose default action ends the
// process. Gloo writes with writev() and libuv with write(), neither with MSG_NOSIGNAL,
// and a library must not change the process's signal dispositions (sx never calls
// exit/abort, docs/conventions.md). So every thread that may write to such a socket runs
// with SIGPIPE blocked: the write then fails with EPIPE, which both libraries handle.
#pragma once

#include <signal.h>

namespace sx {

// Blocks SIGPIPE in the calling thread for the lifetime of the object (threads created
// meanwhile inherit the blocked mask). On destruction a SIGPIPE raised meanwhile is
// consumed before the previous mask returns, so it is never delivered.
class SigpipeBlock {
  public:
    SigpipeBlock() {
        sigemptyset(&pipe_);
        sigaddset(&pipe_, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    }
    ~SigpipeBlock() {
        if (sigismember(&old_, SIGPIPE)) return;  // it was blocked before us: leave it to the owner
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
        }
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
    SigpipeBlock(const SigpipeBlock &) = delete;
    SigpipeBlock &operator=(const SigpipeBlock &) = delete;

  private:
    sigset_t pipe_;
    sigset_t old_;
};

}  // namespace sx
