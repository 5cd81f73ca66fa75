// Parsing of the qmoe tool's option values, shared by its subcommands so that every command
// reads a number alike: decimal digits only (no sign, no spaces, no 0x, no exponent). Each
// parser returns false, leaving *value alone, for anything else, a null text included (the
// option was the last argument).
#ifndef QMOE_TOOLS_QMOE_OPTION_VALUES_H_
#define QMOE_TOOLS_QMOE_OPTION_VALUES_H_

#include <cstdint>

bool parse_u64(const char* text, uint64_t* value);

// In [min, max].
bool parse_u32(const char* text, uint32_t min, uint32_t max, uint32_t* value);

// A finite non-negative decimal: 0.25, 32, .5 (digits and at most one dot).
bool parse_decimal(const char* text, double* value);

// parse_decimal's number as a float, refused when it is too large for one.
bool parse_decimal_float(const char* text, float* value);

// A decimal in [0, 1].
bool parse_fraction(const char* text, double* value);

// Whether --help or -h is among the arguments (it wins over the others, whatever their order).
bool asks_for_help(int argc, char** argv);

#endif  // QMOE_TOOLS_QMOE_OPTION_VALUES_H_
