// Scalar flavour: the fallback on CPUs without AVX2+FMA and on other architectures.
// The loops of kernel_body.h with one float per "vector".
#include "optim/kernel_body.h"
#include "optim/stochastic_round.h"

namespace sx {
namespace optim {
namespace internal {

const KernelTable kScalarKernels = {"scalar", &update_range<ScalarOps>, &sum_of_squares_range<ScalarOps>,
                                    &ScalarOps::encode8, &ScalarOps::decode8, &stochastic_round};

}  // namespace internal
}  // namespace optim
}  // namespace sx
