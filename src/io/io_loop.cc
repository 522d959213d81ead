// IoLoop: two threads of its own, each fed by a queue under one mutex.
//
// Invariants (all under mu):
//  - `work` holds items submitted whose work has not started; the I/O thread takes them
//    in order, runs the work outside the lock, and moves the item to `done`;
//  - `done` holds items whose work has ended and whose completion has not run; the loop
//    thread runs them in order, outside the lock;
//  - `running` counts items between submit and the end of their completion. A completion
//    that submits does so before its own item stops counting, so `running` never reaches
//    zero while follow-up work is owed;
//  - both threads leave once `stopping` is set and `running` is zero.
#include "io/io_loop.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "base/log.h"

namespace sx {
namespace io {

namespace {

struct Item {
    std::function<Status()> work;
    std::function<void(Status)> done;
    Status result;  // written on the I/O thread, read on the loop thread after it
};

}  // namespace

struct IoLoop::Impl {
    std::thread loop_thread, io_thread;
    std::thread::id loop_thread_id;  // set before the first completion can run
    bool started = false;            // both threads running

    std::mutex mu;
    std::condition_variable work_ready, done_ready;
    std::deque<Item *> work, done;  // under mu
    int64_t running = 0;            // under mu
    bool stopping = false;          // under mu

    bool finished() const { return stopping && running == 0; }

    // The I/O thread. Nothing may unwind out of it: catching() turns an exception from
    // the work into a Status.
    void run_works() {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
            work_ready.wait(lock, [&] { return !work.empty() || finished(); });
            if (work.empty()) return;
            Item *item = work.front();
            work.pop_front();
            lock.unlock();
            item->result = catching(item->work);
            lock.lock();
            done.push_back(item);
            done_ready.notify_one();
        }
    }

    void complete(Item *item) {
        if (!item->done) return;
        try {
            item->done(std::move(item->result));
        } catch (const std::exception &e) {
            log(SX_LOG_ERROR, "sx: a checkpoint I/O completion threw an exception: %s", e.what());
        } catch (...) {
            log(SX_LOG_ERROR, "sx: a checkpoint I/O completion threw a non-standard exception");
        }
    }

    // The loop thread: each completion, then the item stops counting; the last one
    // after a stop releases the I/O thread too.
    void run_completions() {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
            done_ready.wait(lock, [&] { return !done.empty() || finished(); });
            if (done.empty()) return;
            Item *item = done.front();
            done.pop_front();
            lock.unlock();
            complete(item);
            delete item;
            lock.lock();
            if (--running == 0 && stopping) work_ready.notify_all();
        }
    }

    // Sets `stopping` and wakes both threads, which leave once nothing is running.
    void stop() {
        std::lock_guard<std::mutex> lock(mu);
        stopping = true;
        work_ready.notify_all();
        done_ready.notify_all();
    }
};

IoLoop::IoLoop() : impl_(new Impl()) {}

Status IoLoop::create(std::unique_ptr<IoLoop> *out) {
    std::unique_ptr<IoLoop> self(new IoLoop());
    Impl *impl = self->impl_.get();
    try {
        impl->loop_thread = std::thread([impl] { impl->run_completions(); });
    } catch (const std::exception &e) {
        return SX_ERROR(SX_ERR_INTERNAL, "cannot start the checkpoint I/O loop thread: %s", e.what());
    }
    impl->loop_thread_id = impl->loop_thread.get_id();
    try {
        impl->io_thread = std::thread([impl] { impl->run_works(); });
    } catch (const std::exception &e) {
        impl->stop();
        impl->loop_thread.join();
        return SX_ERROR(SX_ERR_INTERNAL, "cannot start the checkpoint I/O thread: %s", e.what());
    }
    impl->started = true;
    *out = std::move(self);
    return Status::Ok();
}

IoLoop::~IoLoop() {
    if (!impl_->started) return;
    impl_->stop();
    impl_->io_thread.join();
    impl_->loop_thread.join();
}

void IoLoop::submit(std::function<Status()> work, std::function<void(Status)> done) {
    Item *item = new Item();
    item->work = std::move(work);
    item->done = std::move(done);
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->work.push_back(item);
    ++impl_->running;
    impl_->work_ready.notify_one();
}

bool IoLoop::on_loop_thread() const { return std::this_thread::get_id() == impl_->loop_thread_id; }

}  // namespace io
}  // namespace sx
