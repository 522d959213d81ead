// What the regroup tests share (test_regroup.cc, test_regroup_faults.cc): a rank of the
// model they train (two AdamW params, one per unit, gradients that depend on the step,
// the rank and the world size), the checkpoints it saves, the references the survivors
// are compared with (fresh ranks loading a checkpoint of the step they restored, taking
// the same steps), and the sx-rendezvous store that outlives every rank.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "process_ranks.h"
#include "sx/sx.h"

namespace sxtest {
namespace regroup {

constexpr int kSteps = 8;  // steps 1..kSteps; a checkpoint of step s-1 before step s
constexpr int kKillStep = 5;
constexpr int64_t kShapes[2] = {200000, 33333};
constexpr int64_t kShape8bit = 200192, kShapeC = 3000;
// Not an SX_STATE_* value: Child::state_dtype's model of bf16 params without fp32 masters
// (bf16_stochastic_round = 1: fp32 AdamW state, bf16 params and gradients).
constexpr int kBf16StochasticRound = 100;

// "what: STATUS (the last error message)".
std::string failed(const char *what, sx_status_t st);

// The gradient of element i of param p at step s on rank r of a world of w.
float grad_value(int p, uint64_t i, int s, int r, int w);

// One rank of the model. Params and gradients are read and written through views as
// fp32 (bf16 ones widened and rounded to nearest).
struct Child {
    sx_shard_group_t *g = nullptr;
    int rank = 0, world = 0, stage = 2;
    int memory_copies = 0;  // config->memory_copy_interval
    // A CUDA group, keeping its state on the device or offloading it to the host
    // (SX_SIMULATED_DEVICE must be set: the views are written from the host).
    bool cuda = false, offload = false;
    uint32_t flags = 0;     // config->flags
    int timeout_ms = 20000;
    int64_t b_extra = 0;  // elements param "b" has beyond kShapes[1] (another table)
    // The param group's state dtype. SX_STATE_8BIT: "a" is a whole number of 8-bit
    // blocks (kShape8bit), "b" keeps fp32 state (too few elements for blocks) and a third
    // param "c" (kShapeC, fp32 state too) shares "a"'s unit.
    // kBf16StochasticRound: the params are bf16 without masters.
    int state_dtype = SX_STATE_FP32;
    // Made in this context (named "child"; its rendezvous, ranks and transport are the
    // context's), else on the rendezvous create() is given. Borrowed.
    sx_context_t *context = nullptr;
    ~Child() { sx_destroy_shard_group(g); }

    bool stochastic_round() const { return state_dtype == kBf16StochasticRound; }

    int num_params() const { return state_dtype == SX_STATE_8BIT ? 3 : 2; }
    int unit_of(int p) const { return p == 2 ? 0 : p; }

    // The group, its params and param group: "" or what failed.
    std::string create(const std::string &rendezvous, int shard_size);
    // Every param's values through its view (stage 3: its unit gathered).
    sx_status_t read_params(std::vector<float> *out);
    // The first params' values: the same on every rank (a checkpoint of step 0 holds them).
    sx_status_t init_params();
    // The gradients of step s, then sx_step.
    sx_status_t step(int s);
    sx_status_t save(const std::string &path);
    sx_status_t load(const std::string &path);
};

std::string checkpoint(const std::string &dir, int step);
std::string format_result(const sx_regroup_result_t &r);
// A result file: the step the values continue from, then the values.
bool write_floats(const std::string &path, const std::vector<float> &v, int64_t restored);
bool read_file(const std::string &path, std::string *out);

// Child modes. "clean": --world ranks take steps 1..--until without a loss and save the
// checkpoint of that step into --dir. "reference": --world ranks (mesh --shard-size)
// load the checkpoint of step --from in --dir, take the steps after it to kSteps, and
// rank 0 writes its params into --out.
int clean_child(const ChildArgs &a);
int reference_child(const ChildArgs &a);

// "" if the survivors' result file `out` (the step they restored, their final params)
// equals `world` fresh ranks (mesh shard_size, 0 = flat) that load the checkpoint of
// that step from `dir` and take the same steps; a checkpoint the run never saved is made
// by a run of `clean_world` ranks (mesh clean_shard_size) without a loss. *restored: the
// step.
std::string compare_with_reference(const std::string &dir, const std::string &out, int stage, int world,
                                   int shard_size, int clean_world, int clean_shard_size, int64_t *restored,
                                   int state_dtype = SX_STATE_FP32);

// sx-rendezvous on a free port with a token (in the environment, for the ranks), and its
// tcp:// address; stop_external_store ends both.
std::string start_external_store(pid_t *server);
void stop_external_store(pid_t server);

// A fresh directory's name under /tmp (not made).
std::string temp_dir(const char *what);

}  // namespace regroup
}  // namespace sxtest
