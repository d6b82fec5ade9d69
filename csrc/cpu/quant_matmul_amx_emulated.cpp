// quant_matmul's amx path on amx_tiles.h's scalar emulation of the tile instructions: the same
// quant_matmul_amx.inc (packing, blocking, epilogue) as quant_matmul_amx.cpp, compiled with the
// AVX-512 flags only. For tests on CPUs without AMX (isa.h's set_amx_emulation); never chosen
// otherwise, and some 8x slower than the scalar path.
#include "amx_tiles.h"

#define MET_QMM_TILES EmulatedTiles
#define MET_QMM_AMX matmul_rows_amx_emulated
#include "quant_matmul_amx.inc"
