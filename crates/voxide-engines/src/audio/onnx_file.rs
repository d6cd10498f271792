//! Just enough of the ONNX file format to read a model's graph: its nodes (operator, inputs,
//! outputs, and the attributes that hold weights: a `Constant`'s tensor, an `If`'s branches) and
//! its initializers (the weights), decoded from the protobuf wire format. The embedded engines
//! that voxide runs itself (Smart Turn, Silero VAD) read their weights with it.
//!
//! Field numbers are those of `onnx.proto` (ModelProto, GraphProto, NodeProto, AttributeProto,
//! TensorProto).

use std::collections::HashMap;

/// Why a file is not a model this reader understands.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FormatError(pub String);

fn bad(what: impl Into<String>) -> FormatError {
    FormatError(what.into())
}

/// One operator of the graph.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// The operator, e.g. `MatMul`.
    pub op: String,
    /// Names of the tensors it reads.
    pub inputs: Vec<String>,
    /// Names of the tensors it writes.
    pub outputs: Vec<String>,
    /// Its tensor attributes by name (a `Constant`'s `value`).
    pub tensors: Vec<(String, Tensor)>,
    /// Its graph attributes by name (an `If`'s `then_branch` and `else_branch`).
    pub graphs: Vec<(String, Graph)>,
}

/// A constant tensor's elements, by element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// `FLOAT`.
    F32(Vec<f32>),
    /// `UINT8`.
    U8(Vec<u8>),
    /// `INT8`.
    I8(Vec<i8>),
    /// `INT32`.
    I32(Vec<i32>),
    /// `INT64`.
    I64(Vec<i64>),
}

/// A constant tensor (an initializer).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its shape.
    pub dims: Vec<usize>,
    /// Its elements, row-major.
    pub data: Data,
}

/// A model's graph.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// The operators, in the file's (topological) order.
    pub nodes: Vec<Node>,
    /// The initializers by name.
    pub tensors: HashMap<String, Tensor>,
}

/// Reads the graph of an ONNX model file's bytes.
pub fn parse(bytes: &[u8]) -> Result<Graph, FormatError> {
    let mut graph = None;
    for field in Fields::new(bytes) {
        let (number, value) = field?;
        if number == 7 {
            graph = Some(parse_graph(value.bytes()?)?);
        }
    }
    graph.ok_or_else(|| bad("no graph in the file"))
}

fn parse_graph(bytes: &[u8]) -> Result<Graph, FormatError> {
    let mut graph = Graph::default();
    for field in Fields::new(bytes) {
        match field? {
            (1, value) => graph.nodes.push(parse_node(value.bytes()?)?),
            (5, value) => {
                let (name, tensor) = parse_tensor(value.bytes()?)?;
                graph.tensors.insert(name, tensor);
            }
            _ => {}
        }
    }
    Ok(graph)
}

fn parse_node(bytes: &[u8]) -> Result<Node, FormatError> {
    let mut node = Node::default();
    for field in Fields::new(bytes) {
        match field? {
            (1, value) => node.inputs.push(value.string()?),
            (2, value) => node.outputs.push(value.string()?),
            (4, value) => node.op = value.string()?,
            (5, value) => parse_attribute(value.bytes()?, &mut node)?,
            _ => {}
        }
    }
    Ok(node)
}

/// Keeps an attribute of `node` if it holds a tensor or a graph; the others (numbers, strings,
/// lists) are skipped.
fn parse_attribute(bytes: &[u8], node: &mut Node) -> Result<(), FormatError> {
    let mut name = String::new();
    let mut tensor = None;
    let mut graph = None;
    for field in Fields::new(bytes) {
        match field? {
            (1, value) => name = value.string()?,
            (5, value) => tensor = Some(parse_tensor(value.bytes()?)?.1),
            (6, value) => graph = Some(parse_graph(value.bytes()?)?),
            _ => {}
        }
    }
    if let Some(tensor) = tensor {
        node.tensors.push((name.clone(), tensor));
    }
    if let Some(graph) = graph {
        node.graphs.push((name, graph));
    }
    Ok(())
}

fn parse_tensor(bytes: &[u8]) -> Result<(String, Tensor), FormatError> {
    let mut dims: Vec<i64> = Vec::new();
    let mut data_type = 0;
    let mut name = String::new();
    let mut raw: Option<&[u8]> = None;
    let mut floats = Vec::new();
    let mut ints: Vec<i64> = Vec::new();
    for field in Fields::new(bytes) {
        match field? {
            (1, value) => value.varints(&mut dims)?,
            (2, value) => data_type = value.varint()?,
            // float_data: packed little-endian floats, or one at a time.
            (4, Value::Bytes(b)) => floats.extend(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            (4, Value::Fixed32(v)) => floats.push(f32::from_bits(v)),
            // int32_data (which also carries 8-bit types) and int64_data: varints.
            (5 | 7, value) => value.varints(&mut ints)?,
            (8, value) => name = value.string()?,
            (9, value) => raw = Some(value.bytes()?),
            _ => {}
        }
    }
    let dims: Vec<usize> = dims
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| bad(format!("{name}: negative dimension"))))
        .collect::<Result<_, _>>()?;
    let count: usize = dims.iter().product();
    let data = match (data_type, raw) {
        (1, Some(b)) => Data::F32(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        (1, None) => Data::F32(floats),
        (2, Some(b)) => Data::U8(b.to_vec()),
        (2, None) => Data::U8(ints.iter().map(|&v| v as u8).collect()),
        (3, Some(b)) => Data::I8(b.iter().map(|&v| v as i8).collect()),
        (3, None) => Data::I8(ints.iter().map(|&v| v as i8).collect()),
        (6, Some(b)) => Data::I32(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        (6, None) => Data::I32(ints.iter().map(|&v| v as i32).collect()),
        (7, Some(b)) => Data::I64(
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
        (7, None) => Data::I64(ints),
        (other, _) => {
            return Err(bad(format!(
                "{name}: element type {other} is not supported"
            )));
        }
    };
    let len = match &data {
        Data::F32(v) => v.len(),
        Data::U8(v) => v.len(),
        Data::I8(v) => v.len(),
        Data::I32(v) => v.len(),
        Data::I64(v) => v.len(),
    };
    if len != count {
        return Err(bad(format!(
            "{name}: {len} elements for a shape of {count}"
        )));
    }
    Ok((name, Tensor { dims, data }))
}

/// A field's value, by wire type.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Value<'a> {
    fn bytes(self) -> Result<&'a [u8], FormatError> {
        match self {
            Value::Bytes(b) => Ok(b),
            _ => Err(bad("expected a length-delimited field")),
        }
    }

    fn string(self) -> Result<String, FormatError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| bad("a name is not UTF-8"))
    }

    fn varint(self) -> Result<i64, FormatError> {
        match self {
            Value::Varint(v) => Ok(v as i64),
            _ => Err(bad("expected a varint field")),
        }
    }

    /// A repeated integer field, packed or not.
    fn varints<T: TryFrom<i64>>(self, out: &mut Vec<T>) -> Result<(), FormatError> {
        let mut push = |v: u64| {
            T::try_from(v as i64)
                .map(|v| out.push(v))
                .map_err(|_| bad("an integer out of range"))
        };
        match self {
            Value::Varint(v) => push(v),
            Value::Bytes(mut b) => {
                while !b.is_empty() {
                    push(varint(&mut b)?)?;
                }
                Ok(())
            }
            _ => Err(bad("expected an integer field")),
        }
    }
}

fn varint(bytes: &mut &[u8]) -> Result<u64, FormatError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or_else(|| bad("truncated varint"))?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(bad("varint longer than 10 bytes"))
}

/// The fields of one message, in order.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn next_field(&mut self) -> Result<(u64, Value<'a>), FormatError> {
        let key = varint(&mut self.rest)?;
        let take = |rest: &mut &'a [u8], n: usize| -> Result<&'a [u8], FormatError> {
            if rest.len() < n {
                return Err(bad("truncated field"));
            }
            let (head, tail) = rest.split_at(n);
            *rest = tail;
            Ok(head)
        };
        let value = match key & 7 {
            0 => Value::Varint(varint(&mut self.rest)?),
            1 => {
                take(&mut self.rest, 8)?;
                Value::Fixed64
            }
            2 => {
                let len = usize::try_from(varint(&mut self.rest)?)
                    .map_err(|_| bad("field length out of range"))?;
                Value::Bytes(take(&mut self.rest, len)?)
            }
            5 => {
                let b = take(&mut self.rest, 4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            other => return Err(bad(format!("unsupported wire type {other}"))),
        };
        Ok((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = self.next_field();
        if field.is_err() {
            // Nothing after a malformed field can be trusted.
            self.rest = &[];
        }
        Some(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes one length-delimited field.
    fn field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn reads_nodes_and_initializers_of_a_handmade_model() {
        let mut node = field(1, b"x");
        node.extend(field(1, b"w"));
        node.extend(field(2, b"y"));
        node.extend(field(4, b"MatMul"));
        // A 2x2 int8 tensor "w" in raw_data, dims packed.
        let mut tensor = field(1, &[2, 2]);
        tensor.extend([2 << 3, 3]); // data_type INT8
        tensor.extend(field(8, b"w"));
        tensor.extend(field(9, &[1, 255, 3, 4]));
        let mut graph = field(1, &node);
        graph.extend(field(5, &tensor));
        let mut model = vec![1 << 3, 9]; // ir_version, skipped
        model.extend(field(7, &graph));

        let graph = parse(&model).expect("valid model");
        assert_eq!(graph.nodes.len(), 1);
        assert_eq!(graph.nodes[0].op, "MatMul");
        assert_eq!(graph.nodes[0].inputs, ["x", "w"]);
        assert_eq!(graph.nodes[0].outputs, ["y"]);
        assert_eq!(
            graph.tensors["w"],
            Tensor {
                dims: vec![2, 2],
                data: Data::I8(vec![1, -1, 3, 4])
            }
        );
    }

    #[test]
    fn reads_a_constant_inside_a_branch_of_an_if() {
        // Constant { value: FLOAT [2] = [1.5, -2] } inside If { then_branch }.
        let mut tensor = field(1, &[2]);
        tensor.extend([2 << 3, 1]); // FLOAT
        tensor.extend(field(9, &[0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0]));
        let mut value = field(1, b"value");
        value.extend(field(5, &tensor));
        let mut constant = field(2, b"c");
        constant.extend(field(4, b"Constant"));
        constant.extend(field(5, &value));
        let branch = field(1, &constant);
        let mut then = field(1, b"then_branch");
        then.extend(field(6, &branch));
        let mut choice = field(1, b"cond");
        choice.extend(field(4, b"If"));
        choice.extend(field(5, &then));
        let model = field(7, &field(1, &choice));

        let graph = parse(&model).expect("valid model");
        let (name, branch) = &graph.nodes[0].graphs[0];
        assert_eq!(name, "then_branch");
        let constant = &branch.nodes[0];
        assert_eq!(
            (constant.op.as_str(), constant.outputs[0].as_str()),
            ("Constant", "c")
        );
        assert_eq!(constant.tensors[0].0, "value");
        assert_eq!(constant.tensors[0].1.data, Data::F32(vec![1.5, -2.0]));
    }

    #[test]
    fn a_truncated_file_is_an_error_not_a_panic() {
        let mut tensor = field(1, &[4]);
        tensor.extend([2 << 3, 1]); // FLOAT
        tensor.extend(field(9, &[0; 8])); // two floats for a shape of four
        let graph = field(5, &tensor);
        let model = field(7, &graph);
        assert!(parse(&model).is_err(), "element count mismatch");
        for cut in 1..model.len() {
            assert!(parse(&model[..cut]).is_err(), "cut at {cut}");
        }
        assert!(parse(&[0xff; 12]).is_err());
    }
}
