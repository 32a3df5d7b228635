//! Device conditions that veto a triggered capture: too hot, not charging.
//! Roots are injectable so tests use fake sysfs trees.

use std::path::{Path, PathBuf};

/// The hottest thermal zone, m°C (`/sys/class/thermal/thermal_zone*/temp`).
/// Unreadable zones are skipped; None when no zone could be read.
pub fn max_thermal_millicelsius(thermal_root: &Path) -> Option<i64> {
    let dir = std::fs::read_dir(thermal_root).ok()?;
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("thermal_zone"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("temp")).ok())
        .filter_map(|t| t.trim().parse::<i64>().ok())
        .max()
}

/// Is the device on external power? True when any supply reports
/// `status` Charging/Full, or an AC/USB/Wireless supply reports `online` 1.
pub fn is_charging(power_supply_root: &Path) -> bool {
    let Ok(dir) = std::fs::read_dir(power_supply_root) else {
        return false;
    };
    let read = |p: PathBuf| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).ok();
    dir.flatten().any(|e| {
        let p = e.path();
        if let Some(status) = read(p.join("status")) {
            if status == "Charging" || status == "Full" {
                return true;
            }
        }
        let kind = read(p.join("type")).unwrap_or_default();
        matches!(kind.as_str(), "Mains" | "USB" | "Wireless")
            && read(p.join("online")).as_deref() == Some("1")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, v: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, v).unwrap();
    }

    #[test]
    fn hottest_zone_wins_and_junk_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "thermal_zone0/temp", "41000\n");
        write(d.path(), "thermal_zone1/temp", "52500\n");
        write(d.path(), "thermal_zone2/temp", "garbage\n");
        write(d.path(), "cooling_device0/cur_state", "3\n");
        assert_eq!(max_thermal_millicelsius(d.path()), Some(52500));
        assert_eq!(max_thermal_millicelsius(&d.path().join("missing")), None);
    }

    #[test]
    fn charging_from_status_or_online_supply() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "battery/status", "Discharging\n");
        write(d.path(), "battery/type", "Battery\n");
        write(d.path(), "usb/type", "USB\n");
        write(d.path(), "usb/online", "0\n");
        assert!(!is_charging(d.path()));
        write(d.path(), "usb/online", "1\n");
        assert!(is_charging(d.path()));
        write(d.path(), "usb/online", "0\n");
        write(d.path(), "battery/status", "Charging\n");
        assert!(is_charging(d.path()));
        assert!(!is_charging(&d.path().join("none")));
    }
}
