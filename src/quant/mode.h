// What the GPU engine runs the backbone's Linears in (`--quant`). Auto: what the folder holds,
// tensor by tensor (bf16 for the synthetic benchmark's random weights).
#pragma once
#include <clefrt/clefrt.h>  // QuantMode, parse_quant_mode, quant_mode_name
