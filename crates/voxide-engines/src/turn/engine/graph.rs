//! Finding the parts of a quantised (QDQ) ONNX graph by its structure: which weights a
//! `MatMul` reads, which scale its output is quantised to, which bias follows.
//!
//! The exporter names the weights of a layer's projections `val_93` and the like; only the
//! structure says which is the query's. So the network's loader starts from the tensors that
//! keep their PyTorch names (layer norms, biases) and walks from them.

use std::collections::HashMap;

use crate::audio::onnx_file::{Data, FormatError, Graph, Node, Tensor};

/// How a tensor of `u8` codes maps to real values: `(code - zero) · scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quant {
    /// Real value of one step.
    pub scale: f32,
    /// The code of 0.0.
    pub zero: u8,
}

impl Quant {
    /// The code nearest `x` (ties to even), clamped to `u8`: ONNX `QuantizeLinear`.
    #[inline]
    pub fn code(self, x: f32) -> u8 {
        super::vector::code(x, self.scale, f32::from(self.zero))
    }

    /// The real value of `code`: ONNX `DequantizeLinear`.
    #[inline]
    pub fn value(self, code: u8) -> f32 {
        (i32::from(code) - i32::from(self.zero)) as f32 * self.scale
    }
}

/// An integer sum's requantisation to an output's codes, as ONNX Runtime's quantised
/// operators do it (`MlasRequantizeOutput`): `sum · multiplier`, where the multiplier is
/// the inputs' scales over the output's, clamped to the codes' range and rounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Requant {
    multiplier: f32,
    zero: f32,
    scale: f32,
}

impl Requant {
    /// For sums of products of inputs with scales `a` and `b`, quantised to `out`.
    pub fn new(a: f32, b: f32, out: Quant) -> Self {
        Self {
            multiplier: a * b / out.scale,
            zero: f32::from(out.zero),
            scale: out.scale,
        }
    }

    /// The output code less its zero point.
    #[inline]
    fn steps(self, sum: i32) -> f32 {
        let steps = (sum as f32 * self.multiplier)
            .max(-self.zero)
            .min(255.0 - self.zero);
        super::vector::round_even(steps)
    }

    /// The output's real value.
    #[inline]
    pub fn value(self, sum: i32) -> f32 {
        self.steps(sum) * self.scale
    }
}

/// A quantised weight matrix as the file holds it: `i8` codes, one scale per output channel
/// (the first dimension for Conv and Gemm weights, the last for MatMul's).
#[derive(Debug, Clone)]
pub struct Weights {
    /// The shape.
    pub dims: Vec<usize>,
    /// The codes, row-major.
    pub codes: Vec<i8>,
    /// One scale per output channel.
    pub scales: Vec<f32>,
}

fn bad(what: impl Into<String>) -> FormatError {
    FormatError(what.into())
}

/// A graph indexed for walking: who reads and who writes each tensor.
pub struct Walker<'g> {
    graph: &'g Graph,
    readers: HashMap<&'g str, Vec<&'g Node>>,
    writers: HashMap<&'g str, &'g Node>,
}

impl<'g> Walker<'g> {
    /// Indexes `graph`.
    pub fn new(graph: &'g Graph) -> Self {
        let mut readers: HashMap<&str, Vec<&Node>> = HashMap::new();
        let mut writers = HashMap::new();
        for node in &graph.nodes {
            for input in &node.inputs {
                readers.entry(input.as_str()).or_default().push(node);
            }
            for output in &node.outputs {
                writers.insert(output.as_str(), node);
            }
        }
        Self {
            graph,
            readers,
            writers,
        }
    }

    /// The nodes of type `op` that read `tensor` directly.
    pub fn readers(&self, tensor: &str, op: &str) -> Vec<&'g Node> {
        self.readers
            .get(tensor)
            .map(|nodes| nodes.iter().copied().filter(|n| n.op == op).collect())
            .unwrap_or_default()
    }

    /// The first node of type `op` that reads `tensor`, looking through reshapes and
    /// transposes (which move values without changing them).
    pub fn next(&self, tensor: &str, op: &str) -> Result<&'g Node, FormatError> {
        let mut todo = vec![tensor];
        while let Some(t) = todo.pop() {
            for node in self.readers.get(t).into_iter().flatten() {
                if node.op == op {
                    return Ok(node);
                }
                if matches!(node.op.as_str(), "Reshape" | "Transpose") {
                    todo.extend(node.outputs.first().map(String::as_str));
                }
            }
        }
        Err(bad(format!("no {op} reads {tensor}")))
    }

    /// The only node of type `op` that reads `tensor` directly.
    pub fn reader(&self, tensor: &str, op: &str) -> Result<&'g Node, FormatError> {
        match self.readers(tensor, op).as_slice() {
            [node] => Ok(node),
            nodes => Err(bad(format!(
                "{} {op} nodes read {tensor}, not 1",
                nodes.len()
            ))),
        }
    }

    /// The quantisation `tensor` goes through (the `QuantizeLinear` after it), and the name of
    /// the dequantised tensor the graph goes on with.
    pub fn quant(&self, tensor: &str) -> Result<(Quant, &'g str), FormatError> {
        let q = self.next(tensor, "QuantizeLinear")?;
        let quant = Quant {
            scale: self.scalar(input(q, 1)?)?,
            zero: match self.tensor(input(q, 2)?)?.data {
                Data::U8(ref v) if v.len() == 1 => v[0],
                _ => return Err(bad(format!("{}: zero point is not one u8", q.outputs[0]))),
            },
        };
        let dq = self.reader(output(q)?, "DequantizeLinear")?;
        Ok((quant, output(dq)?))
    }

    /// The `i8` weights behind the dequantised tensor `name`, with their per-channel scales.
    pub fn weights(&self, name: &str) -> Result<Weights, FormatError> {
        let dq = self.dequantize(name)?;
        let codes = self.tensor(input(dq, 0)?)?;
        let Data::I8(ref values) = codes.data else {
            return Err(bad(format!("{name}: weights are not i8")));
        };
        match self.tensor(input(dq, 2)?)?.data {
            Data::I8(ref zeros) if zeros.iter().all(|&z| z == 0) => {}
            _ => return Err(bad(format!("{name}: weights are not symmetric i8"))),
        }
        Ok(Weights {
            dims: codes.dims.clone(),
            codes: values.clone(),
            scales: self.floats(input(dq, 1)?)?.to_vec(),
        })
    }

    /// The `i32` bias behind the dequantised tensor `name` (Conv and Gemm biases), and its
    /// per-channel scales.
    pub fn bias(&self, name: &str) -> Result<(Vec<i32>, Vec<f32>), FormatError> {
        let dq = self.dequantize(name)?;
        let Data::I32(ref values) = self.tensor(input(dq, 0)?)?.data else {
            return Err(bad(format!("{name}: bias is not i32")));
        };
        Ok((values.clone(), self.floats(input(dq, 1)?)?.to_vec()))
    }

    fn dequantize(&self, name: &str) -> Result<&'g Node, FormatError> {
        self.writers
            .get(name)
            .copied()
            .filter(|n| n.op == "DequantizeLinear")
            .ok_or_else(|| bad(format!("{name} is not dequantised weights")))
    }

    /// The initializer `name`.
    pub fn tensor(&self, name: &str) -> Result<&'g Tensor, FormatError> {
        self.graph
            .tensors
            .get(name)
            .ok_or_else(|| bad(format!("no initializer {name}")))
    }

    /// The `f32` elements of the initializer `name`.
    pub fn floats(&self, name: &str) -> Result<&'g [f32], FormatError> {
        match self.tensor(name)?.data {
            Data::F32(ref v) => Ok(v),
            _ => Err(bad(format!("{name} is not f32"))),
        }
    }

    /// The single `f32` of the initializer `name`.
    pub fn scalar(&self, name: &str) -> Result<f32, FormatError> {
        match self.floats(name)? {
            [v] => Ok(*v),
            _ => Err(bad(format!("{name} is not one number"))),
        }
    }

    /// The `LayerNormalization` whose scale is the initializer `weight`.
    pub fn layer_norm(&self, weight: &str) -> Result<&'g Node, FormatError> {
        self.readers(weight, "LayerNormalization")
            .into_iter()
            .next()
            .ok_or_else(|| bad(format!("no layer norm scaled by {weight}")))
    }
}

/// Input `i` of `node`.
pub fn input(node: &Node, i: usize) -> Result<&str, FormatError> {
    node.inputs
        .get(i)
        .map(String::as_str)
        .ok_or_else(|| bad(format!("a {} has no input {i}", node.op)))
}

/// The output of `node`.
pub fn output(node: &Node) -> Result<&str, FormatError> {
    node.outputs
        .first()
        .map(String::as_str)
        .ok_or_else(|| bad(format!("a {} has no output", node.op)))
}
