// IoLoop: one uv_loop_t on its own thread, fed through a mutex-protected queue that
// uv_async_send wakes.
//
// Invariants:
//  - `pending` (under mu) holds items submitted but not yet handed to uv_queue_work;
//    the loop thread moves them out in on_wake. uv_async_send coalesces wake-ups, so
//    on_wake takes everything there is, not one item.
//  - `in_flight` (loop thread only) counts items handed to uv_queue_work whose after
//    callback has not run yet; the loop stays alive through them (libuv counts an
//    uncompleted work request as an active request).
//  - the wake handle is closed, once, only when stopping is set and both pending and
//    in_flight are empty; with it closed and no request active, uv_run returns and the
//    thread ends. A done callback that submits keeps pending non-empty, so its work
//    runs before the close.
#include "io/io_loop.h"

#include <uv.h>

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
    uv_work_t req;  // req.data == this
    std::function<Status()> work;
    std::function<void(Status)> done;
    Status result;  // written on a pool thread, read on the loop thread after it
};

}  // namespace

struct IoLoop::Impl {
    uv_loop_t loop;
    uv_async_t wake;  // wake.data == this
    std::thread thread;
    std::thread::id loop_thread_id;  // set before the thread starts running callbacks
    bool started = false;            // loop and wake initialised, thread running

    std::mutex mu;
    std::deque<Item *> pending;  // under mu
    bool stopping = false;       // under mu

    int64_t in_flight = 0;  // loop thread only
    bool closing = false;   // loop thread only

    static void on_wake(uv_async_t *handle) {
        Impl *self = static_cast<Impl *>(handle->data);
        std::deque<Item *> batch;
        {
            std::lock_guard<std::mutex> lock(self->mu);
            batch.swap(self->pending);
        }
        for (Item *item : batch) {
            // uv_queue_work fails only for a null work callback, which this is not.
            uv_queue_work(&self->loop, &item->req, run_work, after_work);
            ++self->in_flight;
        }
        self->maybe_close();
    }

    // On a pool thread. Nothing may unwind into libuv's C frames.
    static void run_work(uv_work_t *req) {
        Item *item = static_cast<Item *>(req->data);
        item->result = catching(item->work);
    }

    // On the loop thread. status is UV_ECANCELED only for a cancelled request, and
    // nothing here cancels one.
    static void after_work(uv_work_t *req, int) {
        Item *item = static_cast<Item *>(req->data);
        Impl *self = static_cast<Impl *>(req->loop->data);
        if (item->done) {
            try {
                item->done(std::move(item->result));
            } catch (const std::exception &e) {
                log(SX_LOG_ERROR, "sx: a checkpoint I/O completion threw an exception: %s", e.what());
            } catch (...) {
                log(SX_LOG_ERROR, "sx: a checkpoint I/O completion threw a non-standard exception");
            }
        }
        delete item;
        --self->in_flight;
        self->maybe_close();
    }

    // On the loop thread: closes the wake handle once the destructor has asked to stop
    // and no work is left, so that uv_run returns.
    void maybe_close() {
        if (closing || in_flight > 0) return;
        {
            std::lock_guard<std::mutex> lock(mu);
            if (!stopping || !pending.empty()) return;
        }
        closing = true;
        uv_close(reinterpret_cast<uv_handle_t *>(&wake), nullptr);
    }

    void run() {
        uv_run(&loop, UV_RUN_DEFAULT);  // returns once maybe_close has closed the wake handle
    }
};

IoLoop::IoLoop() : impl_(new Impl()) {}

Status IoLoop::create(std::unique_ptr<IoLoop> *out) {
    std::unique_ptr<IoLoop> self(new IoLoop());
    Impl *impl = self->impl_.get();
    int rc = uv_loop_init(&impl->loop);
    SX_CHECK(rc == 0, SX_ERR_INTERNAL, "cannot start the checkpoint I/O loop: uv_loop_init: %s", uv_strerror(rc));
    impl->loop.data = impl;
    rc = uv_async_init(&impl->loop, &impl->wake, Impl::on_wake);
    if (rc != 0) {
        uv_loop_close(&impl->loop);
        return SX_ERROR(SX_ERR_INTERNAL, "cannot start the checkpoint I/O loop: uv_async_init: %s", uv_strerror(rc));
    }
    impl->wake.data = impl;
    try {
        impl->thread = std::thread([impl] { impl->run(); });
    } catch (const std::exception &e) {
        // The handle is closed by a run of the loop on this thread instead.
        uv_close(reinterpret_cast<uv_handle_t *>(&impl->wake), nullptr);
        uv_run(&impl->loop, UV_RUN_DEFAULT);
        uv_loop_close(&impl->loop);
        return SX_ERROR(SX_ERR_INTERNAL, "cannot start the checkpoint I/O thread: %s", e.what());
    }
    impl->loop_thread_id = impl->thread.get_id();
    impl->started = true;
    *out = std::move(self);
    return Status::Ok();
}

IoLoop::~IoLoop() {
    if (!impl_->started) return;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->stopping = true;
    }
    uv_async_send(&impl_->wake);  // the loop thread sees stopping in on_wake's maybe_close
    impl_->thread.join();
    const int rc = uv_loop_close(&impl_->loop);
    if (rc != 0) log(SX_LOG_ERROR, "sx: checkpoint I/O loop close: %s", uv_strerror(rc));
}

void IoLoop::submit(std::function<Status()> work, std::function<void(Status)> done) {
    Item *item = new Item();
    item->req.data = item;
    item->work = std::move(work);
    item->done = std::move(done);
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->pending.push_back(item);
    }
    uv_async_send(&impl_->wake);
}

bool IoLoop::on_loop_thread() const { return std::this_thread::get_id() == impl_->loop_thread_id; }

}  // namespace io
}  // namespace sx
