//! Bad input from a user is a typed error, never a panic.

use crate::common;

use common::{device, ids, tensor};
use headroom_tensor::{DType, Gradients, Tape, TensorError};

#[test]
fn shape_dtype_and_index_errors_are_typed() {
    let device = device();
    let a = tensor(&device, &[2, 3], &[0.0; 6]);
    let b = tensor(&device, &[4, 5], &[0.0; 20]);
    assert!(matches!(a.add(&b), Err(TensorError::ShapeMismatch { .. })));
    assert!(matches!(
        a.matmul(&b),
        Err(TensorError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        a.reshape(&[5]),
        Err(TensorError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        a.transpose(0, 2),
        Err(TensorError::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.narrow(1, 2, 2),
        Err(TensorError::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.dropout(1.0),
        Err(TensorError::InvalidArgument { .. })
    ));
    let h = a.cast(DType::BF16).unwrap();
    assert!(matches!(a.add(&h), Err(TensorError::DTypeMismatch { .. })));
    // Token id 9 in a 2-row table.
    assert!(matches!(
        a.embedding(&ids(&device, &[2], &[0, 9])),
        Err(TensorError::IndexOutOfRange {
            index: 9,
            size: 2,
            ..
        })
    ));
    assert!(matches!(
        a.cross_entropy(&ids(&device, &[2], &[0, -1])),
        Err(TensorError::IndexOutOfRange { index: -1, .. })
    ));
    assert!(matches!(
        a.embedding(&a),
        Err(TensorError::UnsupportedDType { .. })
    ));
}

#[test]
fn backward_errors_are_typed() {
    let device = device();
    let x = tensor(&device, &[2], &[1.0, 2.0]).track();
    let tape = Tape::new();
    let mut grads = Gradients::new();
    // Not a scalar.
    let y = tape.record(|| x.scale(2.0)).unwrap();
    assert!(matches!(
        tape.backward(&y, &mut grads),
        Err(TensorError::Backward(_))
    ));
    // Not recorded.
    let z = x.detach().sum_all().unwrap();
    assert!(matches!(
        tape.backward(&z, &mut grads),
        Err(TensorError::Backward(_))
    ));
}

#[test]
fn shape_only_devices_count_bytes_without_data() {
    // A dry run: the same ops on a device without bytes allocate exactly as on the CPU.
    let device =
        headroom_memory::Device::shape_only(1 << 30, headroom_memory::AllocatorConfig::default());
    let w = headroom_tensor::Tensor::zeros(
        &device,
        &[64, 64],
        DType::F32,
        headroom_memory::Category::Parameter,
        None,
    )
    .unwrap()
    .track();
    let x = headroom_tensor::Tensor::zeros(
        &device,
        &[8, 64],
        DType::F32,
        headroom_memory::Category::Input,
        None,
    )
    .unwrap();
    let tape = Tape::new();
    let loss = tape.record(|| x.matmul(&w)?.relu()?.mean_all()).unwrap();
    // relu saves its (8, 64) f32 output = 2048 bytes; the loss is one 512-byte block.
    assert_eq!(
        device.stats().category_bytes[headroom_memory::Category::Activation.index()].current,
        2048 + 512
    );
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    assert_eq!(
        device.stats().category_bytes[headroom_memory::Category::Gradient.index()].current,
        64 * 64 * 4
    );
    assert!(matches!(
        loss.to_vec_f32(),
        Err(TensorError::ShapeOnly { .. })
    ));
}
