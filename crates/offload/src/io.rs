//! I/O workers: threads that read regions of a [`DiskFile`] into swap buffers and write them
//! back, so transfers overlap the work on other regions and several requests are in flight at
//! once (one per worker). A read is checked against the checksum of the region's last write
//! before it is handed back; a write returns the checksum of what it wrote. Every transfer is
//! timed, so the store can report how much of the I/O the caller waited for.
//!
//! Not for: the order of transfers or which buffer holds what (the store).

use crate::disk::DiskFile;
use crate::error::OffloadError;
use crate::page::AlignedBytes;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A transfer for a worker.
#[derive(Debug)]
pub(crate) enum Request {
    /// Fill `buffer[..bytes]` from `offset` and check it against `crc` (of `buffer[..len]`).
    Read {
        region: usize,
        offset: u64,
        bytes: usize,
        len: usize,
        crc: u32,
        buffer: AlignedBytes,
    },
    /// Write `buffer[..bytes]` at `offset`; answer with the crc of `buffer[..len]`.
    Write {
        region: usize,
        offset: u64,
        bytes: usize,
        len: usize,
        buffer: AlignedBytes,
    },
}

/// A finished transfer: its buffer back, the checksum (writes), the outcome and its seconds.
#[derive(Debug)]
pub(crate) struct Done {
    pub region: usize,
    pub write: bool,
    pub buffer: AlignedBytes,
    pub crc: u32,
    pub bytes: usize,
    pub result: Result<(), OffloadError>,
    pub seconds: f64,
}

/// Worker threads over one file.
#[derive(Debug)]
pub(crate) struct IoWorkers {
    requests: Option<Sender<Request>>,
    done: Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl IoWorkers {
    pub(crate) fn start(file: Arc<DiskFile>, workers: usize) -> Result<IoWorkers, OffloadError> {
        let (requests, inbox) = channel::<Request>();
        let inbox = Arc::new(Mutex::new(inbox));
        let (finished, done) = channel();
        let threads = (0..workers.max(1))
            .map(|i| {
                let (file, inbox, finished) = (file.clone(), inbox.clone(), finished.clone());
                std::thread::Builder::new()
                    .name(format!("offload-io-{i}"))
                    .spawn(move || serve(&file, &inbox, &finished))
                    .map_err(|e| OffloadError::Workers(format!("cannot start a worker: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IoWorkers {
            requests: Some(requests),
            done,
            threads,
        })
    }

    pub(crate) fn submit(&self, request: Request) -> Result<(), OffloadError> {
        self.requests
            .as_ref()
            .expect("workers run until dropped")
            .send(request)
            .map_err(|_| OffloadError::Workers("every worker has exited".into()))
    }

    /// The next finished transfer (blocking).
    pub(crate) fn next_done(&self) -> Result<Done, OffloadError> {
        self.done
            .recv()
            .map_err(|_| OffloadError::Workers("every worker has exited".into()))
    }
}

impl Drop for IoWorkers {
    fn drop(&mut self) {
        self.requests.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve(file: &DiskFile, inbox: &Mutex<Receiver<Request>>, finished: &Sender<Done>) {
    loop {
        let request = {
            let inbox = inbox.lock().unwrap_or_else(|p| p.into_inner());
            match inbox.recv() {
                Ok(r) => r,
                Err(_) => return,
            }
        };
        let start = Instant::now();
        let done = match request {
            Request::Read {
                region,
                offset,
                bytes,
                len,
                crc,
                mut buffer,
            } => {
                let mut result = file.read_at(&mut buffer.as_bytes_mut()[..bytes], offset);
                let found = crc32fast::hash(&buffer.as_bytes()[..len]);
                if result.is_ok() && found != crc {
                    result = Err(OffloadError::Checksum {
                        path: file.path().to_path_buf(),
                        region,
                        offset,
                        expected: crc,
                        found,
                    });
                }
                Done {
                    region,
                    write: false,
                    buffer,
                    crc: found,
                    bytes,
                    result,
                    seconds: 0.0,
                }
            }
            Request::Write {
                region,
                offset,
                bytes,
                len,
                buffer,
            } => {
                let crc = crc32fast::hash(&buffer.as_bytes()[..len]);
                let result = file.write_at(&buffer.as_bytes()[..bytes], offset);
                Done {
                    region,
                    write: true,
                    buffer,
                    crc,
                    bytes,
                    result,
                    seconds: 0.0,
                }
            }
        };
        let done = Done {
            seconds: start.elapsed().as_secs_f64(),
            ..done
        };
        if finished.send(done).is_err() {
            return;
        }
    }
}
