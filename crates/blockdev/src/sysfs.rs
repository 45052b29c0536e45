//! What sysfs says about the storage under a path (hints for transports, never for I/O).

use std::path::{Path, PathBuf};

/// Whether the storage of `path` is rotational media (a spinning disk), as
/// `/sys/dev/block/MAJ:MIN/queue/rotational` says: for a block device node its own queue (a
/// partition's is its disk's), for a regular file the block device its filesystem is on.
/// `false` whenever sysfs does not say (a filesystem without a backing block device such as
/// tmpfs, sysfs not mounted, a path that cannot be read).
pub fn is_rotational(path: &Path) -> bool {
    let Ok(st) = rustix::fs::stat(path) else { return false };
    let is_block = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice;
    let dev = if is_block { st.st_rdev } else { st.st_dev };
    rotational_flag(&PathBuf::from("/sys/dev/block"), rustix::fs::major(dev), rustix::fs::minor(dev))
}

/// `SYS/MAJ:MIN/queue/rotational`, or the parent disk's for a partition (which has no
/// queue of its own).
fn rotational_flag(sys_dev_block: &Path, major: u32, minor: u32) -> bool {
    let dev = sys_dev_block.join(format!("{major}:{minor}"));
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim() == "1");
    read(dev.join("queue/rotational")).or_else(|| read(dev.join("../queue/rotational"))).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_and_their_partitions_report_the_queue_flag() {
        let dir = std::env::temp_dir().join(format!("blockdev-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // sysfs layout: /sys/dev/block/8:0 -> .../sda, 8:1 -> .../sda/sda1 (no queue).
        let sda = dir.join("devices/sda");
        std::fs::create_dir_all(sda.join("queue")).unwrap();
        std::fs::create_dir_all(sda.join("sda1")).unwrap();
        std::fs::write(sda.join("queue/rotational"), "1\n").unwrap();
        let nvme = dir.join("devices/nvme0n1");
        std::fs::create_dir_all(nvme.join("queue")).unwrap();
        std::fs::write(nvme.join("queue/rotational"), "0\n").unwrap();
        let links = dir.join("dev-block");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(&sda, links.join("8:0")).unwrap();
        std::os::unix::fs::symlink(sda.join("sda1"), links.join("8:1")).unwrap();
        std::os::unix::fs::symlink(&nvme, links.join("259:0")).unwrap();
        assert!(rotational_flag(&links, 8, 0));
        assert!(rotational_flag(&links, 8, 1), "a partition takes its disk's flag");
        assert!(!rotational_flag(&links, 259, 0));
        assert!(!rotational_flag(&links, 0, 42), "no sysfs entry: not rotational");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn paths_without_storage_are_not_rotational() {
        assert!(!is_rotational(Path::new("/nonexistent/sealdisk")));
        assert!(!is_rotational(Path::new("/proc/self/status")), "procfs has no block device");
    }
}
