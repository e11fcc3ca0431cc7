// ggml's reference quantizers (quantize_row_*_ref: no importance matrix, deterministic) of the
// low-bit types MoE files ship in, one block at a time, in the layouts dequantize_row reads.
// Their searches for the best scales make the bytes equal to what ggml writes for the same
// floats; quantize() (dequantize.hpp) is the way in.
#pragma once

#include <cstdint>

namespace troupe::gguf {

// x: 256 floats -> one Q2_K block (84 bytes).
void quantize_q2_k_block(const float* x, std::uint8_t* block);
// x: 256 floats -> one Q3_K block (110 bytes).
void quantize_q3_k_block(const float* x, std::uint8_t* block);
// x: 32 floats -> one IQ4_NL block (18 bytes).
void quantize_iq4_nl_block(const float* x, std::uint8_t* block);
// x: 256 floats -> one IQ4_XS block (136 bytes).
void quantize_iq4_xs_block(const float* x, std::uint8_t* block);
// x: 32 floats -> one MXFP4 block (17 bytes).
void quantize_mxfp4_block(const float* x, std::uint8_t* block);

}  // namespace troupe::gguf
