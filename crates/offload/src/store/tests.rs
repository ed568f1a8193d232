use super::*;
use crate::page::PAGE;

fn options(tier: TierKind, dir: Option<&std::path::Path>, dry: bool) -> StoreOptions {
    StoreOptions {
        name: "states".into(),
        tier,
        dir: dir.map(|d| d.to_path_buf()),
        swap_buffers: 3,
        io_workers: 2,
        dry,
    }
}

/// Regions of a master part (f32) and a state part, of `lens[i]` elements each.
fn fill(store: &mut OffloadStore, lens: &[usize]) {
    for (r, &len) in lens.iter().enumerate() {
        let parts = vec![
            Part {
                category: Category::MasterWeight,
                bytes: 4 * len,
            },
            Part {
                category: Category::OptimizerState,
                bytes: 8 * len,
            },
        ];
        store
            .add_region(parts, |mut m| {
                for (k, b) in m.parts[0].iter_mut().enumerate() {
                    *b = (r * 31 + k) as u8;
                }
                m.parts[1].fill(r as u8);
            })
            .unwrap();
    }
}

/// The file of a disk store.
fn file_of(store: &OffloadStore) -> std::path::PathBuf {
    store.stats().path.expect("a disk store has a file").into()
}

const LENS: [usize; 4] = [1000, 3000, 10, 2048];

/// The bytes region `r` holds after `visits` visits that add 1 to every byte.
fn expected(r: usize, len: usize, visits: u8) -> (Vec<u8>, Vec<u8>) {
    let master = (0..4 * len)
        .map(|k| ((r * 31 + k) as u8).wrapping_add(visits))
        .collect();
    (master, vec![(r as u8).wrapping_add(visits); 8 * len])
}

fn add_one(store: &mut OffloadStore, order: &[usize]) {
    store
        .visit(order, |_, m: Option<RegionMut<'_>>| {
            for part in m.unwrap().parts {
                part.iter_mut().for_each(|b| *b = b.wrapping_add(1));
            }
            Ok::<(), OffloadError>(())
        })
        .unwrap();
}

fn check(store: &mut OffloadStore, visits: u8) {
    for (r, &len) in LENS.iter().enumerate() {
        let (master, state) = expected(r, len, visits);
        store
            .read(r, |m| {
                let m = m.unwrap();
                assert_eq!(m.parts[0], &master[..], "region {r} master");
                assert_eq!(m.parts[1], &state[..], "region {r} state");
            })
            .unwrap();
    }
}

/// Whole pages per part, by hand: 1000 f32 = 4,000 B → 1 page; 8,000 B → 2 pages; 3000 →
/// 12,000 B → 3 pages and 24,000 B → 6 pages; 10 → 40 B and 80 B → 1 page each; 2048 →
/// 8,192 B → 2 pages and 16,384 B → 4 pages.
const MASTER_PAGES: u64 = 1 + 3 + 1 + 2;
const STATE_PAGES: u64 = 2 + 6 + 1 + 4;
/// The largest region: 3 + 6 pages.
const LARGEST: u64 = 9 * PAGE as u64;

#[test]
fn host_regions_hold_their_parts_in_whole_pages() {
    let pool = HostPool::new(None, false);
    let mut store = OffloadStore::new(pool.clone(), options(TierKind::Host, None, false)).unwrap();
    fill(&mut store, &LENS);
    add_one(&mut store, &[0, 1, 2, 3]);
    add_one(&mut store, &[3, 2, 1, 0]);
    check(&mut store, 2);
    let s = store.stats();
    assert_eq!(s.host[Category::MasterWeight], MASTER_PAGES * PAGE as u64);
    assert_eq!(s.host[Category::OptimizerState], STATE_PAGES * PAGE as u64);
    assert_eq!(s.disk.total(), 0);
    assert_eq!(s.swap_buffers, 0);
    assert_eq!(pool.stats().held_bytes, s.host_bytes());
}

#[test]
fn disk_regions_move_through_bounded_swap_buffers_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let pool = HostPool::new(None, false);
    let mut store = OffloadStore::new(
        pool.clone(),
        options(TierKind::Disk, Some(dir.path()), false),
    )
    .unwrap();
    fill(&mut store, &LENS);
    for _ in 0..3 {
        add_one(&mut store, &[0, 1, 2, 3]);
    }
    check(&mut store, 3);
    // A replacement is read back at once (the read waits for the write behind it).
    store.write(1, |m| m.unwrap().parts[1].fill(9)).unwrap();
    store
        .read(1, |m| {
            let m = m.unwrap();
            assert!(m.parts[1].iter().all(|&b| b == 9) && m.parts[0].iter().all(|&b| b == 0));
        })
        .unwrap();
    // Replacements in quick succession land in order: the last one is what is read.
    for round in 0..20u8 {
        store.write(2, |m| m.unwrap().parts[0].fill(round)).unwrap();
        store
            .write(2, |m| m.unwrap().parts[0].fill(round + 100))
            .unwrap();
        let first = store.read(2, |m| m.unwrap().parts[0][0]).unwrap();
        assert_eq!(first, round + 100);
    }
    store.write(2, |_| ()).unwrap();
    store.wait_idle().unwrap();
    let s = store.stats();
    assert_eq!(s.host.total(), 0);
    assert_eq!(s.disk[Category::MasterWeight], MASTER_PAGES * PAGE as u64);
    assert_eq!(s.disk[Category::OptimizerState], STATE_PAGES * PAGE as u64);
    assert_eq!((s.swap_buffers, s.swap_buffer_bytes), (3, LARGEST));
    // The pool holds the swap buffers and nothing else.
    assert_eq!(pool.stats().held_bytes, 3 * LARGEST);
    let file_bytes = (MASTER_PAGES + STATE_PAGES) * PAGE as u64;
    // Region 2 is 2 pages (1 + 1).
    let region2 = 2 * PAGE as u64;
    // Written: the initial regions, three visits, one replacement of region 1, 41 of region 2.
    assert_eq!(s.bytes_written, 4 * file_bytes + LARGEST + 41 * region2);
    // Read: three visits, the check, region 1 once more, region 2 twenty times.
    assert_eq!(s.bytes_read, 4 * file_bytes + LARGEST + 20 * region2);
    let on_disk = std::fs::metadata(s.path.as_ref().unwrap()).unwrap().len();
    assert_eq!(on_disk, file_bytes);
}

#[test]
fn a_changed_byte_on_disk_is_a_checksum_error_never_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let pool = HostPool::new(None, false);
    let mut store =
        OffloadStore::new(pool, options(TierKind::Disk, Some(dir.path()), false)).unwrap();
    fill(&mut store, &LENS);
    store.wait_idle().unwrap();
    // Region 1 starts after region 0's 3 pages; flip one of its bytes behind the store.
    let path = file_of(&store);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3 * PAGE + 5] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let e = store.read(1, |_| ()).unwrap_err().to_string();
    assert!(
        e.contains("checksum") && e.contains(&path.display().to_string()) && e.contains("region 1"),
        "{e}"
    );
    // The store stays failed rather than hand out bytes it cannot vouch for.
    assert!(store.read(0, |_| ()).is_err());
}

#[test]
fn a_dry_store_counts_what_a_real_one_holds() {
    let dir = tempfile::tempdir().unwrap();
    for tier in [TierKind::Host, TierKind::Disk] {
        let (real_pool, dry_pool) = (HostPool::new(None, false), HostPool::new(None, false));
        let mut real =
            OffloadStore::new(real_pool.clone(), options(tier, Some(dir.path()), false)).unwrap();
        let mut dry =
            OffloadStore::new(dry_pool.clone(), options(tier, Some(dir.path()), true)).unwrap();
        fill(&mut real, &LENS);
        fill(&mut dry, &LENS);
        let (r, d) = (real.stats(), dry.stats());
        assert_eq!((r.host, r.disk), (d.host, d.disk), "{tier:?}");
        assert_eq!(
            (r.swap_buffers, r.swap_buffer_bytes),
            (d.swap_buffers, d.swap_buffer_bytes)
        );
        assert_eq!(
            real_pool.stats().held_bytes,
            dry_pool.stats().held_bytes,
            "{tier:?}"
        );
        let mut seen = Vec::new();
        dry.visit(&[2, 0], |i, m| {
            assert!(m.is_none());
            seen.push(i);
            Ok::<(), OffloadError>(())
        })
        .unwrap();
        assert_eq!(seen, [2, 0]);
    }
}

#[test]
fn host_regions_over_the_budget_are_refused() {
    // 2 pages fit, the first region takes 3.
    let pool = HostPool::new(Some(2 * PAGE as u64), false);
    let mut store = OffloadStore::new(pool, options(TierKind::Host, None, false)).unwrap();
    let parts = vec![Part {
        category: Category::OptimizerState,
        bytes: 2 * PAGE + 1,
    }];
    let e = store.add_region(parts, |_| ()).unwrap_err().to_string();
    assert!(
        e.contains("host memory") && e.contains("--host-memory"),
        "{e}"
    );
}

#[test]
fn a_file_removed_or_truncated_behind_the_store_never_reads_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let pool = HostPool::new(None, false);
    let mut store =
        OffloadStore::new(pool, options(TierKind::Disk, Some(dir.path()), false)).unwrap();
    fill(&mut store, &LENS);
    store.wait_idle().unwrap();
    // Removed: the open descriptor keeps the bytes (POSIX unlink), so the run goes on.
    let path = file_of(&store);
    std::fs::remove_file(&path).unwrap();
    add_one(&mut store, &[0, 1, 2, 3]);
    check(&mut store, 1);
    // Truncated through another descriptor of the same (removed) file, found by its path
    // among this process's descriptors: a short read is an error.
    let ours = path.to_string_lossy().into_owned();
    let link = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with(&ours))
        })
        .expect("the store holds the file open");
    std::fs::OpenOptions::new()
        .write(true)
        .open(link.path())
        .unwrap()
        .set_len(PAGE as u64)
        .unwrap();
    let e = store.read(3, |_| ()).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
}

/// Two runs on one offload directory (the default one, or the same `--offload-dir`), each with
/// a store of the same name (every run's rank 0 has `optimizer.rank0`): each gets its own file,
/// reads back its own bytes (every checksum holds), and dropping one removes its file only.
#[test]
fn two_stores_of_one_name_in_one_directory_keep_their_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let pool = HostPool::new(None, false);
        OffloadStore::new(pool, options(TierKind::Disk, Some(dir.path()), false)).unwrap()
    };
    let (mut first, mut second) = (open(), open());
    let (a, b) = (file_of(&first), file_of(&second));
    assert_ne!(a, b);
    for path in [&a, &b] {
        assert_eq!(path.parent(), Some(dir.path()));
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("states.") && name.ends_with(".bin"),
            "{name}"
        );
        let pid = format!(".{}-", std::process::id());
        assert!(name.contains(&pid), "{name} names the process");
    }
    fill(&mut first, &LENS);
    fill(&mut second, &LENS);
    add_one(&mut first, &[0, 1, 2, 3]);
    add_one(&mut second, &[3, 2, 1, 0]);
    add_one(&mut second, &[0, 1, 2, 3]);
    first.wait_idle().unwrap();
    drop(first);
    assert!(!a.exists(), "the first store's file goes with it");
    assert!(b.exists(), "the second store's file stays");
    check(&mut second, 2);
    drop(second);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
