// Turn runtime choices into compile-time template parameters, each variant compiled once and
// picked at launch (the pattern of flash-attention's static_switch.h).
#pragma once

#define TCS_BOOL_SWITCH(COND, NAME, ...) \
    [&] {                                \
        if (COND) {                      \
            constexpr bool NAME = true;  \
            return __VA_ARGS__();        \
        } else {                         \
            constexpr bool NAME = false; \
            return __VA_ARGS__();        \
        }                                \
    }()

// Window height of ME-TCF: 16 rows (one full m16 tile) or 8 (the lower half of the tile is zero).
#define TCS_WINDOW_SWITCH(WINDOW_VALUE, NAME, ...) \
    [&] {                                          \
        if ((WINDOW_VALUE) == 8) {                 \
            constexpr int NAME = 8;                \
            return __VA_ARGS__();                  \
        } else {                                   \
            constexpr int NAME = 16;               \
            return __VA_ARGS__();                  \
        }                                          \
    }()

// Output columns per warp, in units of 32 (one m16n8 tile per lane-quad and float4 lane).
#define TCS_SLICE_SWITCH(WIDE, NAME, ...) \
    [&] {                                 \
        if (WIDE) {                       \
            constexpr int NAME = 2;       \
            return __VA_ARGS__();         \
        } else {                          \
            constexpr int NAME = 1;       \
            return __VA_ARGS__();         \
        }                                 \
    }()

// Lanes per slot of the rows kernels: the fewest, a power of two up to 32, that reach LANES.
#define TCS_LANES_SWITCH(LANES, NAME, ...)         \
    [&] {                                          \
        if ((LANES) <= 1) {                        \
            constexpr int NAME = 1;                \
            return __VA_ARGS__();                  \
        } else if ((LANES) <= 2) {                 \
            constexpr int NAME = 2;                \
            return __VA_ARGS__();                  \
        } else if ((LANES) <= 4) {                 \
            constexpr int NAME = 4;                \
            return __VA_ARGS__();                  \
        } else if ((LANES) <= 8) {                 \
            constexpr int NAME = 8;                \
            return __VA_ARGS__();                  \
        } else if ((LANES) <= 16) {                \
            constexpr int NAME = 16;               \
            return __VA_ARGS__();                  \
        } else {                                   \
            constexpr int NAME = 32;               \
            return __VA_ARGS__();                  \
        }                                          \
    }()
