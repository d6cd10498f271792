//! The float tensors of a PyTorch file in its legacy format (before `torch.save` wrote zip
//! archives): five pickles one after another (a magic number, the protocol version, system
//! information, the saved object, the keys of its storages), then each storage as a
//! little-endian element count and its raw data. Tensors in the object are
//! `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` calls whose storage
//! is a persistent id `("storage", type, key, location, count, view)`.
//!
//! Only what a state dict of float tensors needs is read; anything else is an error.

use std::collections::HashMap;

/// Why the file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("not a legacy PyTorch file of float tensors: {0}")]
pub struct TorchError(String);

fn bad(reason: impl Into<String>) -> TorchError {
    TorchError(reason.into())
}

/// A tensor: its shape and its values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its size along each axis.
    pub shape: Vec<usize>,
    /// Its values, the last axis fastest.
    pub values: Vec<f32>,
}

#[derive(Debug, Clone)]
enum Value {
    Mark,
    /// None, a bool or a float: nothing a tensor needs.
    Other,
    Int(i64),
    Str(String),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global(String, String),
    Storage(String),
    Tensor {
        key: String,
        offset: usize,
        shape: Vec<usize>,
        stride: Vec<usize>,
    },
}

/// The tensors under `field` of the saved object (a dict), by name: a checkpoint's
/// `"model_state"`.
pub fn read_state(bytes: &[u8], field: &str) -> Result<HashMap<String, Tensor>, TorchError> {
    let mut at = 0;
    for _ in 0..3 {
        unpickle(bytes, &mut at)?;
    }
    let saved = unpickle(bytes, &mut at)?;
    let Value::List(keys) = unpickle(bytes, &mut at)? else {
        return Err(bad("no list of storage keys"));
    };
    let mut storages: HashMap<String, &[u8]> = HashMap::new();
    for key in keys {
        let Value::Str(key) = key else {
            return Err(bad("a storage key that is not a string"));
        };
        let count = u64::from_le_bytes(take(bytes, &mut at, 8)?.try_into().expect("8 bytes"));
        let count = usize::try_from(count).map_err(|_| bad("a storage too large"))?;
        let data = take(bytes, &mut at, count.checked_mul(4).ok_or(bad("overflow"))?)?;
        storages.insert(key, data);
    }
    let Value::Dict(items) = saved else {
        return Err(bad("the saved object is not a dict"));
    };
    let state = items
        .into_iter()
        .find_map(|(k, v)| matches!(&k, Value::Str(s) if s == field).then_some(v))
        .ok_or_else(|| bad(format!("no {field}")))?;
    let Value::Dict(state) = state else {
        return Err(bad(format!("{field} is not a dict")));
    };
    let mut tensors = HashMap::new();
    for (name, value) in state {
        let (
            Value::Str(name),
            Value::Tensor {
                key,
                offset,
                shape,
                stride,
            },
        ) = (name, value)
        else {
            continue;
        };
        let data = storages
            .get(&key)
            .ok_or_else(|| bad(format!("no storage {key}")))?;
        let count: usize = shape.iter().product();
        let mut values = Vec::with_capacity(count);
        for flat in 0..count {
            // The element's place in the storage, from its index along each axis.
            let mut rest = flat;
            let mut place = offset;
            for (size, step) in shape.iter().zip(&stride).rev() {
                place += (rest % size) * step;
                rest /= size;
            }
            let b = data
                .get(place * 4..place * 4 + 4)
                .ok_or_else(|| bad(format!("{name} runs past its storage")))?;
            values.push(f32::from_le_bytes(b.try_into().expect("4 bytes")));
        }
        tensors.insert(name, Tensor { shape, values });
    }
    Ok(tensors)
}

fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], TorchError> {
    let end = at.checked_add(n).ok_or(bad("overflow"))?;
    let slice = bytes.get(*at..end).ok_or(bad("the file ends early"))?;
    *at = end;
    Ok(slice)
}

fn byte(bytes: &[u8], at: &mut usize) -> Result<u8, TorchError> {
    Ok(take(bytes, at, 1)?[0])
}

fn u32_le(bytes: &[u8], at: &mut usize) -> Result<u32, TorchError> {
    Ok(u32::from_le_bytes(
        take(bytes, at, 4)?.try_into().expect("4 bytes"),
    ))
}

fn line(bytes: &[u8], at: &mut usize) -> Result<String, TorchError> {
    let rest = bytes.get(*at..).ok_or(bad("the file ends early"))?;
    let end = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or(bad("a line never ends"))?;
    let text = String::from_utf8(rest[..end].to_vec()).map_err(|_| bad("a line not in UTF-8"))?;
    *at += end + 1;
    Ok(text)
}

fn index(value: &Value) -> Result<usize, TorchError> {
    match value {
        Value::Int(i) => usize::try_from(*i).map_err(|_| bad("a negative size")),
        _ => Err(bad("a size that is not a number")),
    }
}

fn sizes(value: &Value) -> Result<Vec<usize>, TorchError> {
    match value {
        Value::Tuple(items) => items.iter().map(index).collect(),
        _ => Err(bad("a shape that is not a tuple")),
    }
}

/// Runs one pickle from `at` to its STOP; the value it leaves.
fn unpickle(bytes: &[u8], at: &mut usize) -> Result<Value, TorchError> {
    let mut stack: Vec<Value> = Vec::new();
    let mut memo: HashMap<u32, Value> = HashMap::new();
    let pop = |stack: &mut Vec<Value>| stack.pop().ok_or(bad("the stack ran out"));
    let to_mark = |stack: &mut Vec<Value>| -> Result<Vec<Value>, TorchError> {
        let mark = stack
            .iter()
            .rposition(|v| matches!(v, Value::Mark))
            .ok_or(bad("no mark"))?;
        let items = stack.split_off(mark + 1);
        stack.pop();
        Ok(items)
    };
    loop {
        let op = byte(bytes, at)?;
        match op {
            0x80 => {
                byte(bytes, at)?;
            }
            b'.' => return pop(&mut stack),
            b'(' => stack.push(Value::Mark),
            b'q' => {
                let i = u32::from(byte(bytes, at)?);
                memo.insert(i, stack.last().ok_or(bad("empty stack"))?.clone());
            }
            b'r' => {
                let i = u32_le(bytes, at)?;
                memo.insert(i, stack.last().ok_or(bad("empty stack"))?.clone());
            }
            b'h' => {
                let i = u32::from(byte(bytes, at)?);
                stack.push(memo.get(&i).ok_or(bad("a memo that is not there"))?.clone());
            }
            b'j' => {
                let i = u32_le(bytes, at)?;
                stack.push(memo.get(&i).ok_or(bad("a memo that is not there"))?.clone());
            }
            b'X' => {
                let n = u32_le(bytes, at)? as usize;
                let text = String::from_utf8(take(bytes, at, n)?.to_vec())
                    .map_err(|_| bad("a string not in UTF-8"))?;
                stack.push(Value::Str(text));
            }
            b'K' => stack.push(Value::Int(i64::from(byte(bytes, at)?))),
            b'M' => {
                let b = take(bytes, at, 2)?;
                stack.push(Value::Int(i64::from(u16::from_le_bytes([b[0], b[1]]))));
            }
            b'J' => {
                let b = take(bytes, at, 4)?;
                stack.push(Value::Int(i64::from(i32::from_le_bytes(
                    b.try_into().expect("4 bytes"),
                ))));
            }
            0x8a => {
                let n = byte(bytes, at)? as usize;
                let b = take(bytes, at, n)?;
                if n > 8 {
                    // The file's magic number: no size.
                    stack.push(Value::Other);
                    continue;
                }
                let mut le = [if b.last().is_some_and(|&x| x & 0x80 != 0) {
                    0xff
                } else {
                    0
                }; 8];
                le[..n].copy_from_slice(b);
                stack.push(Value::Int(i64::from_le_bytes(le)));
            }
            b'G' => {
                take(bytes, at, 8)?;
                stack.push(Value::Other);
            }
            b'N' | 0x88 | 0x89 => stack.push(Value::Other),
            b')' => stack.push(Value::Tuple(Vec::new())),
            0x85 => {
                let a = pop(&mut stack)?;
                stack.push(Value::Tuple(vec![a]));
            }
            0x86 => {
                let b = pop(&mut stack)?;
                let a = pop(&mut stack)?;
                stack.push(Value::Tuple(vec![a, b]));
            }
            0x87 => {
                let c = pop(&mut stack)?;
                let b = pop(&mut stack)?;
                let a = pop(&mut stack)?;
                stack.push(Value::Tuple(vec![a, b, c]));
            }
            b't' => {
                let items = to_mark(&mut stack)?;
                stack.push(Value::Tuple(items));
            }
            b'}' => stack.push(Value::Dict(Vec::new())),
            b']' => stack.push(Value::List(Vec::new())),
            b's' => {
                let v = pop(&mut stack)?;
                let k = pop(&mut stack)?;
                match stack.last_mut() {
                    Some(Value::Dict(items)) => items.push((k, v)),
                    _ => return Err(bad("SETITEM on no dict")),
                }
            }
            b'u' => {
                let items = to_mark(&mut stack)?;
                let Some(Value::Dict(dict)) = stack.last_mut() else {
                    return Err(bad("SETITEMS on no dict"));
                };
                let mut items = items.into_iter();
                while let (Some(k), Some(v)) = (items.next(), items.next()) {
                    dict.push((k, v));
                }
            }
            b'a' => {
                let v = pop(&mut stack)?;
                match stack.last_mut() {
                    Some(Value::List(items)) => items.push(v),
                    _ => return Err(bad("APPEND on no list")),
                }
            }
            b'e' => {
                let items = to_mark(&mut stack)?;
                match stack.last_mut() {
                    Some(Value::List(list)) => list.extend(items),
                    _ => return Err(bad("APPENDS on no list")),
                }
            }
            b'c' => {
                let module = line(bytes, at)?;
                let name = line(bytes, at)?;
                stack.push(Value::Global(module, name));
            }
            b'Q' => {
                let Value::Tuple(pid) = pop(&mut stack)? else {
                    return Err(bad("a persistent id that is not a tuple"));
                };
                match pid.as_slice() {
                    [Value::Str(tag), Value::Global(_, kind), Value::Str(key), ..]
                        if tag == "storage" =>
                    {
                        if kind != "FloatStorage" {
                            return Err(bad(format!("a {kind}, not floats")));
                        }
                        stack.push(Value::Storage(key.clone()));
                    }
                    _ => return Err(bad("a persistent id that is no storage")),
                }
            }
            b'R' => {
                let args = pop(&mut stack)?;
                let callable = pop(&mut stack)?;
                let Value::Global(module, name) = callable else {
                    return Err(bad("a call of something that is not a global"));
                };
                let value = match (module.as_str(), name.as_str(), args) {
                    ("torch._utils", "_rebuild_tensor_v2", Value::Tuple(args)) => {
                        let [Value::Storage(key), offset, shape, stride, ..] = args.as_slice()
                        else {
                            return Err(bad("a tensor without its storage"));
                        };
                        Value::Tensor {
                            key: key.clone(),
                            offset: index(offset)?,
                            shape: sizes(shape)?,
                            stride: sizes(stride)?,
                        }
                    }
                    ("collections", "OrderedDict", _) => Value::Dict(Vec::new()),
                    (module, name, _) => return Err(bad(format!("a call of {module}.{name}"))),
                };
                stack.push(value);
            }
            b'b' => {
                // An object's state (an OrderedDict's metadata): not needed.
                pop(&mut stack)?;
            }
            other => return Err(bad(format!("pickle opcode {other:#04x}"))),
        }
    }
}
