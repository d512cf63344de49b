// Stands in for deep_jit's exception.hpp (which needs elfutils for its stack traces): its two macros, as
// plain exceptions.
#pragma once
#include <stdexcept>
#include <string>

#define DJ_PANIC(...) throw std::runtime_error(std::string("deep_jit panic: ") + std::format(__VA_ARGS__))
#define DJ_HOST_ASSERT(condition, ...) \
    do { if (not (condition)) throw std::runtime_error("deep_jit assertion failed: " #condition); } while (0)
