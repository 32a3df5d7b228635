/*
 * Forced include (-include shim.h) for building AOSP's bpfloader
 * (system/bpf libbpf_android/Loader.cpp and bpfloader/BpfLoader.cpp) on a
 * glibc host against Debian's android-libbase/liblog/libcutils.
 *
 * Only what bionic provides and glibc 2.36 does not: bionic's `__unused`
 * attribute macro and strlcpy (glibc gained it in 2.38). Loader.cpp also
 * relies on <algorithm> (std::sort, std::replace) and <cstring> reaching it
 * through bionic's libc++ headers transitively.
 */
#pragma once

#define __unused __attribute__((unused))

#include <string.h>

#ifdef __cplusplus
#include <algorithm>
#include <cstring>
extern "C" {
#endif

/* BSD strlcpy: copies at most size-1 bytes, always NUL-terminates when
 * size > 0, returns strlen(src) so truncation is detectable. */
static inline size_t strlcpy(char *dst, const char *src, size_t size) {
    size_t len = strlen(src);
    if (size > 0) {
        size_t n = len < size - 1 ? len : size - 1;
        memcpy(dst, src, n);
        dst[n] = '\0';
    }
    return len;
}

#ifdef __cplusplus
}
#endif
