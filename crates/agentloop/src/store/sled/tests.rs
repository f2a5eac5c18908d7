use super::*;

/// A fresh directory with a `blobs/` inside, removed on drop.
struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn dir(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!(
        "agentloop-sled-power-{tag}-{}-{}",
        std::process::id(),
        crate::store::now_ms()
    ));
    std::fs::create_dir_all(d.join("blobs")).unwrap();
    std::fs::write(d.join("snap.old"), b"s").unwrap();
    Dir(d)
}

/// What a tracker must report: a blob created since the last look (to fsync, with
/// its directory), an entry renamed into the database's directory (a snapshot: the
/// directory to fsync), and nothing once it was reported (the listing reports a
/// fresh blob at one more look: it cannot tell a finished blob from one being
/// written).
fn reports_changes_once(mut changed: impl FnMut(&Path) -> Changed, tag: &str, again: bool) {
    let d = dir(tag);
    let first = changed(&d.0);
    assert!(first.new_blobs.is_empty(), "{tag}: nothing new yet");
    std::fs::write(d.0.join("blobs").join("4096"), b"blob").unwrap();
    std::fs::write(d.0.join("snap.tmp"), b"s").unwrap();
    std::fs::rename(d.0.join("snap.tmp"), d.0.join("snap.new")).unwrap();
    let blob = vec![std::ffi::OsString::from("4096")];
    let c = changed(&d.0);
    assert!(c.root && c.blobs, "{tag}: both directories changed");
    assert_eq!(c.new_blobs.into_iter().collect::<Vec<_>>(), blob, "{tag}");
    let next = changed(&d.0);
    assert!(
        !next.root && !next.blobs,
        "{tag}: the entries reported once"
    );
    let resynced: Vec<_> = next.new_blobs.into_iter().collect();
    assert_eq!(resynced.is_empty(), !again, "{tag}: {resynced:?}");
    let last = changed(&d.0);
    assert!(
        !last.root && !last.blobs && last.new_blobs.is_empty(),
        "{tag}: nothing left"
    );
    std::fs::remove_file(d.0.join("snap.old")).unwrap();
    assert!(changed(&d.0).root, "{tag}: a removal changes the directory");
}

#[test]
fn listing_reports_new_blobs_and_entry_changes_once() {
    let mut seen: Option<Entries> = None;
    reports_changes_once(
        |d| {
            let now = Entries::list(d).unwrap();
            match &mut seen {
                None => {
                    seen = Some(now);
                    Changed::default()
                }
                Some(s) => s.advance(now),
            }
        },
        "list",
        true,
    );
}

#[cfg(target_os = "linux")]
#[test]
fn inotify_reports_new_blobs_and_entry_changes_once() {
    let mut w: Option<watch::DirWatch> = None;
    reports_changes_once(
        |d| match &mut w {
            None => {
                w = Some(watch::DirWatch::new(d).expect("an inotify watch"));
                Changed::default()
            }
            Some(w) => w.changed(d).unwrap(),
        },
        "inotify",
        false,
    );
}

/// inotify reports a blob to sync once sled closed it after writing it whole, not
/// when it appears (its bytes are not there yet).
#[cfg(target_os = "linux")]
#[test]
fn inotify_reports_a_blob_once_it_is_written_whole() {
    use std::io::Write as _;
    let d = dir("closed");
    let mut w = watch::DirWatch::new(&d.0).expect("an inotify watch");
    let mut f = std::fs::File::create_new(d.0.join("blobs").join("8192")).unwrap();
    let c = w.changed(&d.0).unwrap();
    assert!(c.blobs, "the entry appeared");
    assert!(
        c.new_blobs.is_empty(),
        "not yet written whole: {:?}",
        c.new_blobs
    );
    f.write_all(b"the blob's bytes").unwrap();
    drop(f);
    let c = w.changed(&d.0).unwrap();
    assert_eq!(
        c.new_blobs.into_iter().collect::<Vec<_>>(),
        vec![std::ffi::OsString::from("8192")]
    );
}

/// At `power` a record larger than sled's blob threshold goes to a blob file that
/// the flush makes durable; the backend reports its level.
#[test]
fn power_opens_and_writes_at_power() {
    let d = dir("open");
    std::fs::remove_file(d.0.join("snap.old")).unwrap();
    let b = SledBackend::open(&d.0).unwrap();
    assert_eq!(b.durability(), StoreDurability::Power);
    b.put_raw(b"k", &vec![7u8; 300 * 1024]).unwrap();
    b.flush().unwrap();
    assert!(
        !names(&d.0.join("blobs")).unwrap().is_empty(),
        "a blob was written"
    );
    drop(b);
    let b = SledBackend::open_at(&d.0, StoreDurability::Crash).unwrap();
    assert_eq!(b.durability(), StoreDurability::Crash);
}
