// CRC32C through Intel ISA-L (libisal), which picks an SSE4.2 (crc32 instruction) or
// PCLMULQDQ folding path at run time, and a table-driven one elsewhere.
//
// ISA-L's convention: crc32_iscsi(buf, len, init) takes the raw shift register and
// returns the raw register, with no inversion on either side. The standard CRC32C
// (RFC 3720 B.4, and this module's crc32c_extend) inverts the register on entry and on
// exit, so that the value of no bytes is 0. Hence
//     crc32c_extend(crc, d, n) = ~crc32_iscsi(d, n, ~crc),
// and chaining works because the exit inversion of one call cancels the entry
// inversion of the next: ~(~x) = x, the raw register carried over unchanged.
#include "io/crc32c.h"

#include <isa-l/crc.h>

#include "base/vector_state.h"

namespace sx {
namespace io {

namespace detail {

uint32_t crc32c_extend_in_pieces(uint32_t crc, const void *data, size_t n, size_t max_piece) {
    // ISA-L reads only; its parameter lacks const.
    unsigned char *p = static_cast<unsigned char *>(const_cast<void *>(data));
    if (max_piece == 0 || max_piece > kCrc32cMaxPiece) max_piece = kCrc32cMaxPiece;
    unsigned int reg = ~crc;
    while (n > 0) {
        const size_t piece = n < max_piece ? n : max_piece;  // <= kCrc32cMaxPiece < INT_MAX
        reg = crc32_iscsi(p, static_cast<int>(piece), reg);
        p += piece;
        n -= piece;
    }
    // ISA-L's folding code (AVX-512 VPCLMULQDQ where the processor has it) leaves the
    // wide registers' upper halves in use, on the caller's thread.
    leave_vector_state_clean();
    return ~reg;
}

}  // namespace detail

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t n) {
    return detail::crc32c_extend_in_pieces(crc, data, n, detail::kCrc32cMaxPiece);
}

}  // namespace io
}  // namespace sx
