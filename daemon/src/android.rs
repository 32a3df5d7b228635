//! What vitalsd touches on an Android device, in one place.
//!
//! `ANDROID_PATHS` is the list of absolute paths (a trailing `/` means "and
//! everything below"; `<pid>` stands for any process id) that the daemon and
//! the libraries it calls (aya) may open on Android. The tests in
//! `android/tests/` check that every entry is labelled, either by our
//! `sepolicy/file_contexts` or by an AOSP label listed in [`AOSP_LABELS`], and
//! that `sepolicy/vitalsd.te` grants vitalsd that label. They also scan the
//! daemon's source for path literals, so a new path in code without a policy
//! entry fails `cargo test`.
//!
//! `init/vitalsd.rc` grants no capability (attaching from pins needs none
//! where SELinux gates bpf(2) and perf_event_open); a test checks it.

/// Every path vitalsd (and aya on its behalf) may open on Android, with the
/// code path that opens it.
pub const ANDROID_PATHS: &[(&str, &str)] = &[
    // procfs readers
    ("/proc/stat", "procfs::stat (system CPU)"),
    ("/proc/loadavg", "procfs::loadavg"),
    (
        "/proc/pressure/cpu",
        "procfs::pressure (absent files are tolerated)",
    ),
    ("/proc/pressure/io", "procfs::pressure"),
    ("/proc/pressure/memory", "procfs::pressure"),
    (
        "/proc/<pid>/",
        "procfs::sampler: /proc/<pid>/{stat,status,cmdline}, task/<tid>/stat of every process",
    ),
    (
        "/proc/self/",
        "procfs::sampler self_rss (/proc/self/status); aya reads /proc/self/fdinfo/<fd>",
    ),
    (
        "/proc/sys/kernel/pid_max",
        "bpf::features::read_pid_max: sizes the wakeup-time array",
    ),
    (
        "/proc/sys/kernel/random/boot_id",
        "store::SystemClock: the boot a capture's CLOCK_BOOTTIME stamp belongs to",
    ),
    // eBPF loader
    (
        "/sys/kernel/tracing/",
        "bpf::tracefs::Tracefs::find_or_mount, format(); aya reads events/<cat>/<name>/id",
    ),
    (
        "/sys/kernel/btf/vmlinux",
        "bpf::Features::probe (exists()); aya EbpfLoader::new loads kernel BTF if readable",
    ),
    (
        "/sys/devices/system/cpu/possible",
        "system::possible_cpus, aya::util::nr_cpus (per-CPU map sizes)",
    ),
    (
        "/sys/devices/system/cpu/online",
        "system::online_cpus (perf fault source: one perf event per online CPU)",
    ),
    // capture vetoes
    (
        "/sys/class/thermal/",
        "triggers::conditions::max_thermal_millicelsius",
    ),
    (
        "/sys/class/power_supply/",
        "triggers::conditions::is_charging",
    ),
    // service
    ("/vendor/etc/vitalsd.toml", "config::DEFAULT_PATH_ANDROID"),
    (
        "/data/misc/vitalsd/",
        "store (captures, index.json), heapprofd::default_state_file (rate limits)",
    ),
    (
        "/data/misc/vitalsd/heapprofd/",
        "heapprofd::runner: the traces it opens for `perfetto --out -`, and <trace>.meta.json",
    ),
    (
        "/dev/socket/vitalsd",
        "control::server::bind_or_inherit (created by init from vitalsd.rc)",
    ),
    (
        "/system/bin/perfetto",
        "heapprofd::route::DEFAULT_PERFETTO_BIN (exec, domain transition to perfetto)",
    ),
    (
        "/system/bin/vitalsd",
        "the daemon's own executable (init exec)",
    ),
    (
        "/dev/socket/traced_producer",
        "producer (the Perfetto SDK connects; producer::connection watches the connection)",
    ),
    (
        "/dev/socket/traced_consumer",
        "heapprofd::in_process (heapprofd.consumer = \"in_process\": connect() probe, then the \
         Perfetto SDK's consumer connection)",
    ),
];

/// How an AOSP platform policy labels paths vitalsd reads, written as the
/// `genfs_contexts` / `file_contexts` lines of system/sepolicy that provide
/// them: (mount point or `file_contexts`, path under it, type).
///
/// These come from AOSP's platform policy, not from us: vitalsd's policy
/// must not relabel them (a label collision with the platform). They were
/// written from knowledge of AOSP's system/sepolicy, not checked against a
/// tree here (none is available on these machines); an integrator confirms
/// them on the device with `ls -Z`.
pub const AOSP_LABELS: &[(&str, &str, &str)] = &[
    ("/proc", "/stat", "proc_stat"),
    ("/proc", "/loadavg", "proc_loadavg"),
    ("/proc", "/pressure/cpu", "proc_pressure_cpu"),
    ("/proc", "/pressure/io", "proc_pressure_io"),
    ("/proc", "/pressure/memory", "proc_pressure_mem"),
    ("/proc", "/sys/kernel/random", "proc_random"),
    // Android mounts tracefs on /sys/kernel/tracing; the events the
    // platform lets traced_probes use on user builds (sched_switch,
    // sched_wakeup, sched_wakeup_new, sched_process_free among them) are
    // debugfs_tracing.
    ("/sys/kernel/tracing", "/", "debugfs_tracing"),
    ("/sys", "/devices/system/cpu", "sysfs_devices_system_cpu"),
    ("/sys", "/class/thermal", "sysfs_thermal"),
    ("/sys", "/class/power_supply", "sysfs_batteryinfo"),
    (
        "file_contexts",
        "/vendor/etc/vitalsd.toml",
        "vendor_configs_file",
    ),
    ("file_contexts", "/system/bin/perfetto", "perfetto_exec"),
    (
        "file_contexts",
        "/dev/socket/traced_producer",
        "traced_producer_socket",
    ),
    (
        "file_contexts",
        "/dev/socket/traced_consumer",
        "traced_consumer_socket",
    ),
];

/// Paths labelled per process rather than by a file rule: /proc/<pid> gets
/// the process's own domain, so the .te grants read on `domain`
/// (`r_dir_file(vitalsd, domain)`), and /proc/self is vitalsd's own domain.
pub const PROCESS_LABELLED: &[(&str, &str)] =
    &[("/proc/<pid>/", "domain"), ("/proc/self/", "self")];

/// Paths vitalsd may try to open on Android that the policy deliberately
/// does not grant, and what happens instead.
pub const NOT_GRANTED: &[(&str, &str)] = &[
    (
        "/sys/class/power_supply/",
        "sysfs_batteryinfo: AOSP lets the platform read battery state only through the \
         health HAL (public/domain.te neverallow on coredomain), so is_charging reads \
         \"not charging\" there and `require_charging` must stay false on Android",
    ),
    (
        "/proc/sys/kernel/pid_max",
        "AOSP has no dedicated label for it (generic proc); when the read is denied \
         bpf::features::read_pid_max falls back to the bounded wakeup hash",
    ),
    (
        "/sys/kernel/btf/vmlinux",
        "optional: our programs take offsets from tracefs, not CO-RE; aya loads \
         without kernel BTF and Features::probe reports `BTF no`",
    ),
];

/// Path literals in the daemon's source that are not opened on Android, or
/// only as roots joined with a path listed above; the source scan skips them.
pub const SOURCE_SCAN_EXEMPT: &[(&str, &str)] = &[
    (
        "/proc",
        "procfs root (DEFAULT_PROC_ROOT, config proc_root); joined with the /proc entries above",
    ),
    (
        "/sys",
        "sysfs root passed to system::{possible,online}_cpus; joined with the /sys entries above",
    ),
    (
        "/proc/pressure",
        "counter descriptions in export.rs; the files read are /proc/pressure/{cpu,io,memory}",
    ),
    (
        "/sys/kernel/debug/tracing",
        "Linux-only fallback: Android mounts tracefs on /sys/kernel/tracing, which is tried \
         first, and does not mount debugfs on user builds",
    ),
    (
        "/run/perfetto",
        "Linux-only: producer::connection mirrors perfetto's GetProducerSocket() default",
    ),
    (
        "/sys/bus/event_source/devices/kprobe",
        "bpf::programs::switch_in, checked for existence at load only: the policy does not \
         grant the kprobe PMU, so on Android the off-CPU switch-in is fentry or nothing",
    ),
    (
        "/run/perfetto/traced-consumer.sock",
        "Linux-only default of the traced consumer socket (Android: /dev/socket/traced_consumer)",
    ),
    (
        "/run/perfetto/traced-producer.sock",
        "Linux-only default of the traced producer socket (Android: /dev/socket/traced_producer)",
    ),
    (
        "/proc/kallsyms",
        "events::kernel_stacks, off-CPU captures only (`vitalsd record --offcpu`, a rule's \
         `capture = { offcpu = true }`): the policy does not grant it, and a denied open \
         or kptr_restrict 2 (Android's default; vitalsd keeps no CAP_SYSLOG) both leave \
         kernel frames saying 'kernel symbols hidden' while user frames resolve; also \
         bpf::programs::switch_in's kprobe name at load, where a denied open leaves \
         off-CPU user stacks walked at the switch-out",
    ),
    (
        "/run/vitalsd/vitalsd.sock",
        "Linux default socket (cfg!(not(target_os = \"android\")))",
    ),
];

#[cfg(test)]
mod tests;
