/* emu_internal.h: what the runtime's files of tests/cuda_emu (emu_runtime.cpp, emu_streams.cpp,
 * emu_graphs.cpp) ask of each other; emu_enqueue, which the stand-ins in include/ use too, is in
 * cuda_emu.h. */
#ifndef CTITAN_CUDA_EMU_INTERNAL_H
#define CTITAN_CUDA_EMU_INTERNAL_H

#include "cuda_runtime_api.h"

/* emu_runtime.cpp: prints "cuda_emu: <message>" on stderr, makes e the last error, returns e. */
cudaError_t emu_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* emu_streams.cpp: whether s is a created, not yet destroyed stream (and its flags). */
bool emu_stream_live(cudaStream_t s, unsigned *flags);

/* emu_graphs.cpp */
bool emu_stream_capturing(cudaStream_t s);
/* cudaErrorStreamCaptureUnsupported and the capture invalidated when `what` may not run now: during
 * any capture (`any_mode`), or else during a Global capture or a ThreadLocal one of this thread
 * (CUDA's "potentially unsafe" calls, which Relaxed captures allow); cudaSuccess otherwise. */
cudaError_t emu_capture_forbid(const char *what, bool any_mode);
/* Marks the active capture, if there is one, invalidated (by `why`). */
void emu_capture_invalidate(const char *why);

#endif
