/*
 * QMOE_API marks the exported C ABI. The library is built with hidden visibility by default
 * (and a linker version script), so only functions marked here leave libqmoe.so.
 */
#ifndef QMOE_QMOE_EXPORT_H_
#define QMOE_QMOE_EXPORT_H_

#if defined(_WIN32)
#if defined(QMOE_BUILDING_SHARED)
#define QMOE_API __declspec(dllexport)
#elif defined(QMOE_STATIC)
#define QMOE_API
#else
#define QMOE_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define QMOE_API __attribute__((visibility("default")))
#else
#define QMOE_API
#endif

#endif /* QMOE_QMOE_EXPORT_H_ */
