//! What the `headroom` binary shows people: pictures and tables built from the libraries' data.

pub mod communication;
pub mod offload;
pub mod plot;
pub mod progress;
pub mod timeline;
pub mod train_report;
