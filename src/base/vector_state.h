// The caller's wide vector registers, as sx leaves them. Code with 256- or 512-bit
// registers leaves their upper halves "in use" until a vzeroupper; SSE code that runs
// after it on the same core (the trainer's, an OpenMP team it starts afterwards) then
// pays a transition or false-dependency penalty on every instruction: llm.c's training
// step ran 2.2-2.4x slower after a load whose CRC32C (ISA-L's) had left them so. So every
// entry point returns (api/guard.h), and every callback of the trainer's is called
// (a save's, a whole-state gather's, the log's), after leave_vector_state_clean(), and
// so does sx's CRC32C after ISA-L's assembly: the compiler ends sx's own AVX functions
// with vzeroupper only when it optimises.
#pragma once

namespace sx {

// vzeroupper where the processor has AVX; nothing elsewhere. Any thread.
void leave_vector_state_clean();

}  // namespace sx
