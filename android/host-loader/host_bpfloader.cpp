/*
 * host-bpfloader: AOSP's bpfloader, built for a Linux host, loading the
 * objects named on the command line the way it loads the *.o files in /system/etc/bpf
 * at boot.
 *
 * The AOSP sources are compiled from the AOSP tree (see README.md); this
 * file only supplies a main(). It includes bpfloader/BpfLoader.cpp with its
 * main() renamed, so the platform Location (allowed program types, pin
 * prefix, allowed selinux/pin domains) and the pin-subdirectory setup are
 * AOSP's own; only the directory the object is read from differs, because
 * the host has no /system/etc/bpf. Pins go to the hard-coded /sys/fs/bpf/,
 * so run it in a private mount namespace over a fresh bpffs.
 *
 * Usage: host-bpfloader BUILD_TYPE OBJECT.o...
 *   BUILD_TYPE sets ro.build.type (user, userdebug, eng) for the loader's
 *   ignore_on_* checks. Exit status: 0 if every object loaded, 1 otherwise
 *   (unlike bpfloader, which only fails for `critical` objects).
 */
#define main aosp_bpfloader_main
#include "bpfloader/BpfLoader.cpp"
#undef main

#include <cstring>

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BUILD_TYPE OBJECT.o...\n", argv[0]);
        return 64;
    }
    if (!android::base::SetProperty("ro.build.type", argv[1])) {
        fprintf(stderr, "host-bpfloader: cannot set ro.build.type\n");
        return 1;
    }
    // As BpfLoader.cpp main(): every location's pin subdirectory first.
    for (const auto& location : locations) {
        if (createSysFsBpfSubDir(location.prefix)) return 1;
    }
    // The core-OS location (/system/etc/bpf/) is the first entry; refuse to
    // guess if a tree orders them differently.
    const android::bpf::Location& platform = locations[0];
    if (strcmp(platform.dir, "/system/etc/bpf/") != 0) {
        fprintf(stderr, "host-bpfloader: locations[0] is %s, not /system/etc/bpf/\n",
                platform.dir);
        return 1;
    }
    int failed = 0;
    for (int i = 2; i < argc; i++) {
        bool critical = false;
        int ret = android::bpf::loadProg(argv[i], &critical, platform);
        if (ret) {
            // Loader.cpp returns -1 for most failures (the reason is in its
            // log above), which strerror would misname as EPERM.
            fprintf(stderr, "host-bpfloader: %s: loadProg ret %d (%s)\n", argv[i], ret,
                    ret == -1 ? "see the loader's log" : strerror(ret < 0 ? -ret : ret));
            failed = 1;
        } else {
            fprintf(stderr, "host-bpfloader: %s: loaded\n", argv[i]);
        }
    }
    return failed;
}
