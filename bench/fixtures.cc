// Helpers of the sections that write and read checkpoints (fixtures.h).
#include "fixtures.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/half.h"
#include "bench_util.h"

namespace sxbench {

std::string g_root;

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "bench_sx: %s\n", what.c_str());
    if (!g_root.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(g_root, ec);
    }
    std::exit(1);
}

void check(sx_status_t s, const char *what) {
    if (s != SX_OK) die(std::string(what) + " failed: " + sx_last_error_message());
}

void check_sys(bool ok, const std::string &what) {
    if (!ok) die(what + ": " + std::strerror(errno));
}

// Removes what a timed run wrote, then lets the file system settle before the next
// one: syncfs commits the journal, and with it the discard of the freed extents (on a
// file system mounted with -o discard, as here), which would otherwise land in the
// middle of the next timed write.
void remove_tree(const std::string &path) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) die("removing " + path + ": " + ec.message());
    const int fd = ::open(g_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    check_sys(fd >= 0, "open " + g_root);
    check_sys(::syncfs(fd) == 0, "syncfs " + g_root);
    ::close(fd);
}

sx_shard_group_t *make_adamw_group(const sx_group_config_t &cfg, int64_t n, int32_t dtype) {
    sx_shard_group_t *g = nullptr;
    check(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    check(sx_add_param_group(g, &pg, nullptr), "sx_add_param_group");
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.name = "w";
    d.ndim = 1;
    d.shape = &n;
    d.dtype = dtype;
    check(sx_add_param(g, &d, nullptr), "sx_add_param");
    check(sx_finalize(g), "sx_finalize");
    return g;
}

sx_shard_group_t *make_group(const std::string &url, int rank, int world, int threads, size_t n, bool take_step,
                             uint32_t flags, int32_t dtype, int32_t grad_dtype) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.flags = flags;
    cfg.rendezvous = url.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.num_threads = threads;
    cfg.timeout_ms = 600000;
    cfg.grad_dtype = grad_dtype;
    sx_shard_group_t *g = make_adamw_group(cfg, static_cast<int64_t>(n), dtype);
    sx_view_t pv, gv;
    sx_view_init(&pv, sizeof pv);
    sx_view_init(&gv, sizeof gv);
    check(sx_param_view(g, 0, &pv), "sx_param_view");
    check(sx_grad_view(g, 0, &gv), "sx_grad_view");
    fill(pv, 1.0f);
    fill(gv, 0.01f);
    if (take_step) {
        sx_step_options_t so;
        sx_step_options_init(&so, sizeof so);
        so.keep_grads = 1;
        check(sx_step(g, &so, nullptr), "sx_step");
    }
    return g;
}

void fill(const sx_view_t &v, float scale) {
    std::vector<float> chunk(4096);
    for (uint64_t i = 0; i < v.numel; i += chunk.size()) {
        const size_t m = static_cast<size_t>(std::min<uint64_t>(chunk.size(), v.numel - i));
        for (size_t k = 0; k < m; ++k)
            chunk[k] = scale * static_cast<float>(static_cast<int>((i + k) % 2001) - 1000) / 1000.0f;
        if (v.dtype == SX_DTYPE_F32) {
            std::memcpy(static_cast<float *>(v.data) + i, chunk.data(), m * sizeof(float));
        } else {
            sx::half::from_f32(v.dtype, chunk.data(), static_cast<uint16_t *>(v.data) + i, m);
        }
    }
}

// Saves g's state into `path`; returns the seconds the call blocked the caller, and in
// *total_s (if not null) the seconds until the save completed, from the call.
double save(sx_shard_group_t *g, const std::string &path, bool synchronous, double *total_s) {
    sx_save_options_t o;
    sx_save_options_init(&o, sizeof o);
    o.path = path.c_str();
    o.synchronous = synchronous ? 1 : 0;
    sx_future_t *f = nullptr;
    const double t0 = now_seconds();
    check(sx_save_optim_state(g, &o, &f), "sx_save_optim_state");
    const double t1 = now_seconds();
    const sx_status_t s = sx_future_wait(f, -1);
    const double t2 = now_seconds();
    if (s != SX_OK) die(std::string("the save of ") + path + " failed: " + sx_future_error_message(f));
    sx_future_destroy(f);
    if (total_s) *total_s = t2 - t0;
    return t1 - t0;
}

// The sizes of the shard files of the checkpoint in dir, in bytes.
uint64_t shard_bytes(const std::string &dir, std::vector<std::string> *files) {
    uint64_t total = 0;
    for (const auto &e : std::filesystem::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("shard-", 0) != 0) continue;
        total += e.file_size();
        if (files) files->push_back(e.path().string());
    }
    if (files) std::sort(files->begin(), files->end());
    return total;
}

// The peer of a load: reads each file whole, sequentially in kReadPiece pieces.
void plain_read(const std::vector<std::string> &paths, std::vector<char> *buf) {
    buf->resize(size_t(4) << 20);  // sx reads 4 MiB chunks
    for (const std::string &path : paths) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        check_sys(fd >= 0, "open " + path);
        for (;;) {
            const ssize_t rc = ::read(fd, buf->data(), buf->size());
            check_sys(rc >= 0, "read " + path);
            if (rc == 0) break;
        }
        ::close(fd);
    }
}

// Drops the file's pages from the page cache: they are clean (the save fsynced them),
// so POSIX_FADV_DONTNEED evicts them. Returns the fraction still resident after, from
// mincore, to show that it worked.
double drop_cache(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check_sys(fd >= 0, "open " + path);
    struct stat st;
    check_sys(::fstat(fd, &st) == 0, "stat " + path);
    check_sys(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0, "posix_fadvise " + path);
    double resident = 0;
    const size_t size = static_cast<size_t>(st.st_size), page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (size > 0) {
        void *map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
        check_sys(map != MAP_FAILED, "mmap " + path);
        std::vector<unsigned char> vec((size + page - 1) / page);
        check_sys(::mincore(map, size, vec.data()) == 0, "mincore " + path);
        size_t in = 0;
        for (unsigned char v : vec) in += v & 1;
        resident = static_cast<double>(in) / static_cast<double>(vec.size());
        ::munmap(map, size);
    }
    ::close(fd);
    return resident;
}

double max_of(const double *v, int n) { return *std::max_element(v, v + n); }

sx_context_t *make_context(const std::string &rendezvous, int rank, int world, int32_t timeout_ms) {
    sx_context_config_t c;
    sx_context_config_init(&c, sizeof c);
    c.rendezvous = rendezvous.c_str();
    c.rank = rank;
    c.world_size = world;
    c.backend = SX_BACKEND_CPU;
    c.num_threads = 1;
    c.timeout_ms = timeout_ms;
    sx_context_t *ctx = nullptr;
    if (sx_create_context(&c, &ctx) != SX_OK)
        std::fprintf(stderr, "bench_sx: rank %d: the context: %s\n", rank, sx_last_error_message());
    return ctx;
}

}  // namespace sxbench
