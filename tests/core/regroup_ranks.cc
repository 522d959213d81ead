// The regroup tests' common part (regroup_ranks.h).
#include "regroup_ranks.h"

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "sx_cmocka.h"
#include "test_groups.h"
#include "view_values.h"

extern char **environ;

namespace sxtest {
namespace regroup {

std::string failed(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + " (" + sx_last_error_message() + ")";
}

float grad_value(int p, uint64_t i, int s, int r, int w) {
    return std::sin(0.013f * static_cast<float>(i) + 0.7f * static_cast<float>(s) + 0.37f * static_cast<float>(r) +
                    1.3f * static_cast<float>(p)) /
           static_cast<float>(w);
}

std::string Child::create(const std::string &rendezvous, int shard_size) {
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    if (context) {
        c.context = context;
        c.name = "child";
    } else {
        c.rendezvous = rendezvous.c_str();
        c.rank = rank;
        c.world_size = world;
        c.backend = cuda || offload ? SX_BACKEND_CUDA : SX_BACKEND_CPU;
        c.num_threads = 1;
        c.timeout_ms = timeout_ms;
    }
    c.offload = offload ? SX_OFFLOAD_STATE : SX_OFFLOAD_NONE;
    c.stage = stage;
    c.shard_size = shard_size;
    c.memory_copy_interval = memory_copies;
    c.flags = flags;
    sx_status_t st = sx_create_shard_group(&c, &g);
    if (st != SX_OK) return failed("create", st);
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW);
    d.lr = 1e-2;
    d.weight_decay = 0.01;
    d.state_dtype = stochastic_round() ? SX_STATE_FP32 : state_dtype;
    d.bf16_stochastic_round = stochastic_round() ? 1 : 0;
    if ((st = sx_add_param_group(g, &d, nullptr)) != SX_OK) return failed("param group", st);
    const char *names[3] = {"a", "b", "c"};
    const int64_t shapes[3] = {state_dtype == SX_STATE_8BIT ? kShape8bit : kShapes[0], kShapes[1] + b_extra, kShapeC};
    for (int p = 0; p < num_params(); ++p) {
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        pd.name = names[p];
        pd.ndim = 1;
        pd.shape = &shapes[p];
        pd.unit = unit_of(p);
        pd.dtype = stochastic_round() ? SX_DTYPE_BF16 : SX_DTYPE_F32;
        if ((st = sx_add_param(g, &pd, nullptr)) != SX_OK) return failed("add_param", st);
    }
    if ((st = sx_finalize(g)) != SX_OK) return failed("finalize", st);
    return "";
}

sx_status_t Child::read_params(std::vector<float> *out) {
    out->clear();
    for (int p = 0; p < num_params(); ++p) {
        sx_status_t st;
        if (stage == 3 && (st = sx_unit_gather(g, unit_of(p))) != SX_OK) return st;
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if ((st = sx_param_view(g, p, &v)) != SX_OK) return st;
        for (uint64_t i = 0; i < v.numel; ++i) out->push_back(view_get(v, i));
        if (stage == 3 && (st = sx_unit_release(g, unit_of(p))) != SX_OK) return st;
    }
    return SX_OK;
}

sx_status_t Child::init_params() {
    for (int p = 0; p < num_params(); ++p) {
        sx_status_t st;
        if (stage == 3 && (st = sx_unit_gather(g, unit_of(p))) != SX_OK) return st;
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if ((st = sx_param_view(g, p, &v)) != SX_OK) return st;
        for (uint64_t i = 0; i < v.numel; ++i) view_put(v, i, std::cos(0.1f * i + p));
        if (stage == 3 && (st = sx_unit_release(g, unit_of(p))) != SX_OK) return st;
    }
    return sx_broadcast_params(g, 0);
}

sx_status_t Child::step(int s) {
    for (int p = 0; p < num_params(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_status_t st = sx_grad_view(g, p, &v);
        if (st != SX_OK) return st;
        for (uint64_t i = 0; i < v.numel; ++i) view_put(v, i, grad_value(p, i, s, rank, world));
    }
    return sx_step(g, nullptr, nullptr);
}

sx_status_t Child::save(const std::string &path) { return sxtest::save_synchronously(g, path); }

sx_status_t Child::load(const std::string &path) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    return sx_load_optim_state(g, &lo);
}

std::string checkpoint(const std::string &dir, int step) { return dir + "/step-" + std::to_string(step); }

std::string format_result(const sx_regroup_result_t &r) {
    char text[256];
    std::snprintf(text, sizeof text, "epoch %d, rank %d of %d (shard %d), was %d of %d, step %llu, from memory %d",
                  r.epoch, r.rank, r.world_size, r.shard_size, r.previous_rank, r.previous_world_size,
                  static_cast<unsigned long long>(r.step), r.from_memory);
    return text;
}

bool write_floats(const std::string &path, const std::vector<float> &v, int64_t restored) {
    std::ofstream f(path + ".tmp", std::ios::binary);
    f.write(reinterpret_cast<const char *>(&restored), sizeof restored);
    f.write(reinterpret_cast<const char *>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    f.close();
    return f.good() && std::rename((path + ".tmp").c_str(), path.c_str()) == 0;
}

bool read_file(const std::string &path, std::string *out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::stringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return true;
}


int clean_child(const ChildArgs &a) {
    Child c;
    c.rank = a.rank;
    c.world = a.world;
    c.stage = std::stoi(a.get("--stage", "2"));
    c.state_dtype = std::stoi(a.get("--state-dtype", "0"));
    const int until = std::stoi(a.get("--until", "0"));
    std::string err = c.create(a.rendezvous, std::stoi(a.get("--shard-size", "0")));
    sx_status_t st = SX_OK;
    if (err.empty() && (st = c.init_params()) != SX_OK) err = failed("init", st);
    for (int s = 1; err.empty() && s <= until; ++s)
        if ((st = c.step(s)) != SX_OK) err = failed("step", st);
    if (err.empty() && (st = c.save(checkpoint(a.get("--dir", ""), until))) != SX_OK) err = failed("save", st);
    if (!err.empty()) {
        std::fprintf(stderr, "clean rank %d: %s\n", a.rank, err.c_str());
        return 3;
    }
    return 0;
}

int reference_child(const ChildArgs &a) {
    Child c;
    c.rank = a.rank;
    c.world = a.world;
    c.stage = std::stoi(a.get("--stage", "2"));
    c.state_dtype = std::stoi(a.get("--state-dtype", "0"));
    const int from = std::stoi(a.get("--from", "0"));
    std::string err = c.create(a.rendezvous, std::stoi(a.get("--shard-size", "0")));
    sx_status_t st = SX_OK;
    if (err.empty() && (st = c.load(checkpoint(a.get("--dir", ""), from))) != SX_OK) err = failed("load", st);
    for (int s = from + 1; err.empty() && s <= kSteps; ++s)
        if ((st = c.step(s)) != SX_OK) err = failed("step", st);
    std::vector<float> params;
    if (err.empty() && (st = c.read_params(&params)) != SX_OK) err = failed("read params", st);
    if (err.empty() && c.rank == 0 && !write_floats(a.get("--out", ""), params, from)) err = "cannot write";
    if (!err.empty()) {
        std::fprintf(stderr, "reference rank %d: %s\n", a.rank, err.c_str());
        return 3;
    }
    return 0;
}


std::string compare_with_reference(const std::string &dir, const std::string &out, int stage, int world,
                                   int shard_size, int clean_world, int clean_shard_size, int64_t *restored,
                                   int state_dtype) {
    std::string survivors, reference;
    if (!read_file(out, &survivors) || survivors.size() < sizeof *restored) return "no result in " + out;
    std::memcpy(restored, survivors.data(), sizeof *restored);
    struct stat st;
    if (stat((checkpoint(dir, static_cast<int>(*restored)) + "/MANIFEST").c_str(), &st) != 0) {
        // The survivors restored a step the run never saved: ranks take it without a loss.
        const std::string clean = run_process_ranks(
            clean_world, {"--mode", "clean", "--stage", std::to_string(stage), "--shard-size",
                          std::to_string(clean_shard_size), "--dir", dir, "--until", std::to_string(*restored),
                          "--state-dtype", std::to_string(state_dtype)},
            120);
        if (!clean.empty()) return "the run without a loss: " + clean;
    }
    const std::string ref = out + ".reference";
    const std::string err = run_process_ranks(
        world, {"--mode", "reference", "--stage", std::to_string(stage), "--shard-size", std::to_string(shard_size),
                "--dir", dir, "--from", std::to_string(*restored), "--out", ref, "--state-dtype",
                std::to_string(state_dtype)},
        120);
    if (!err.empty()) return "reference: " + err;
    if (!read_file(ref, &reference)) return "no reference result";
    if (survivors.size() != reference.size())
        return "the survivors wrote " + std::to_string(survivors.size()) + " bytes, the reference " +
               std::to_string(reference.size());
    if (survivors != reference)
        return "the survivors' params differ from " + std::to_string(world) + " ranks loaded from step " +
               std::to_string(*restored);
    return "";
}

// The sx-rendezvous command on a free port, with the token of the environment; its pid.
namespace {

pid_t start_rendezvous(int port) {
    std::vector<std::string> args = {SX_RENDEZVOUS_PATH, "--port", std::to_string(port), "--bind", "127.0.0.1",
                                     "--max-ranks", "8"};
    std::vector<char *> argv;
    for (auto &s : args) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, SX_RENDEZVOUS_PATH, nullptr, nullptr, argv.data(), environ) != 0) return -1;
    // Listening once a connection succeeds.
    for (int i = 0; i < 500; ++i) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr;
        std::memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const bool up = connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0;
        close(fd);
        if (up) return pid;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
}

void stop_rendezvous(pid_t pid) {
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
}

}  // namespace

std::string start_external_store(pid_t *server) {
    const int port = sxtest::free_port();
    setenv("SX_RENDEZVOUS_TOKEN", "regroup-test-token", 1);
    *server = start_rendezvous(port);
    return "tcp://127.0.0.1:" + std::to_string(port) + "?server=external";
}

void stop_external_store(pid_t server) {
    stop_rendezvous(server);
    unsetenv("SX_RENDEZVOUS_TOKEN");
}

std::string temp_dir(const char *what) {
    char templ[] = "/tmp/sx-regroup-XXXXXX";
    const char *d = mkdtemp(templ);
    return d ? std::string(d) + "-" + what : "";
}


}  // namespace regroup
}  // namespace sxtest
