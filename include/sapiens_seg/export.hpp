// Symbol visibility for libsapiens_seg: only what is marked SAPIENS_SEG_API leaves the library.
#pragma once

#if defined(_WIN32)
#if defined(SAPIENS_SEG_BUILDING)
#define SAPIENS_SEG_API __declspec(dllexport)
#else
#define SAPIENS_SEG_API __declspec(dllimport)
#endif
#else
#define SAPIENS_SEG_API __attribute__((visibility("default")))
#endif
