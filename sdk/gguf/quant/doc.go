// Package quant converts between float32 and the ggml tensor encodings:
// IEEE half (F16), bfloat16 (BF16) and the block-quantized types.
//
// Dequantize covers F32, F16, BF16, F64, I8, I16, I32, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.
// Quantize covers F32, F16, BF16, I32 (rounding), Q8_0, Q4_0, Q4_K and
// Q6_K. Both work on whole rows: the element count must be a multiple of the
// type's block size.
//
// Dequantization follows ggml's reference routines exactly (tests: the GGUF
// spec's test vectors, and values from ggml itself for Q2_K/Q3_K). Q8_0,
// Q4_0, Q4_K and Q6_K quantization reproduces ggml's quantize_row_*_ref
// byte for byte (tests compare hashes on fixed inputs); llama-quantize with
// an importance matrix chooses differently.
package quant
