//! Reads CTranslate2 `model.bin` files: a version, the spec's name and revision, then each
//! variable as name, rank, dims, dtype and raw bytes, then aliases (one name standing for another).

use std::collections::HashMap;

/// One stored variable.
#[derive(Debug, Clone)]
pub struct Variable {
    /// Dimensions (empty for a scalar).
    pub dims: Vec<usize>,
    /// CTranslate2's type code.
    pub dtype: DType,
    /// Little-endian contents.
    pub bytes: Vec<u8>,
}

/// Element types of a CTranslate2 model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
}

impl DType {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => DType::F32,
            1 => DType::I8,
            2 => DType::I16,
            3 => DType::I32,
            4 => DType::F16,
            5 => DType::Bf16,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            DType::I8 => 1,
            DType::I16 | DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
}

/// A parsed model: its spec and variables by name (aliases resolved).
#[derive(Debug, Clone)]
pub struct Ct2Model {
    /// The spec's name, e.g. `WhisperSpec`.
    pub spec: String,
    /// Variables by name.
    pub variables: HashMap<String, Variable>,
}

/// Why a file could not be parsed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("not a CTranslate2 model: {0}")]
pub struct Ct2Error(String);

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Ct2Error> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or_else(|| Ct2Error(format!("truncated at byte {}", self.at)))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, Ct2Error> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Ct2Error> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, Ct2Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A u16-length string, NUL-terminated inside its length.
    fn string(&mut self) -> Result<String, Ct2Error> {
        let n = usize::from(self.u16()?);
        let bytes = self.take(n)?;
        let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
        String::from_utf8(bytes.to_vec()).map_err(|_| Ct2Error("a name is not UTF-8".into()))
    }
}

impl Ct2Model {
    /// Parses the bytes of a `model.bin`.
    pub fn parse(data: &[u8]) -> Result<Self, Ct2Error> {
        let mut r = Reader { data, at: 0 };
        let version = r.u32()?;
        if !(2..=6).contains(&version) {
            return Err(Ct2Error(format!("unsupported format version {version}")));
        }
        let spec = r.string()?;
        let _revision = r.u32()?;
        let count = r.u32()? as usize;
        let mut variables = HashMap::with_capacity(count);
        for _ in 0..count {
            let name = r.string()?;
            let rank = usize::from(r.u8()?);
            let dims = (0..rank)
                .map(|_| r.u32().map(|d| d as usize))
                .collect::<Result<Vec<_>, _>>()?;
            let code = r.u8()?;
            let dtype = DType::from_code(code)
                .ok_or_else(|| Ct2Error(format!("{name}: unknown type code {code}")))?;
            let len = r.u32()? as usize;
            let expected = dims.iter().product::<usize>() * dtype.size();
            if len != expected {
                return Err(Ct2Error(format!(
                    "{name}: {len} bytes for dims {dims:?} of {dtype:?}"
                )));
            }
            let bytes = r.take(len)?.to_vec();
            variables.insert(name, Variable { dims, dtype, bytes });
        }
        // Aliases follow in format 5 and later.
        if version >= 5 && r.at < data.len() {
            let aliases = r.u32()?;
            for _ in 0..aliases {
                let alias = r.string()?;
                let target = r.string()?;
                if let Some(v) = variables.get(&target).cloned() {
                    variables.insert(alias, v);
                }
            }
        }
        Ok(Self { spec, variables })
    }

    /// The variable `name`.
    pub fn get(&self, name: &str) -> Result<&Variable, Ct2Error> {
        self.variables
            .get(name)
            .ok_or_else(|| Ct2Error(format!("variable {name} is missing")))
    }

    /// A small integer scalar (e.g. `encoder/num_heads`).
    pub fn scalar(&self, name: &str) -> Result<i64, Ct2Error> {
        let v = self.get(name)?;
        let b = &v.bytes;
        Ok(match (v.dtype, b.len()) {
            (DType::I8, 1) => i64::from(b[0] as i8),
            (DType::I16, 2) => i64::from(i16::from_le_bytes([b[0], b[1]])),
            (DType::I32, 4) => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            _ => return Err(Ct2Error(format!("{name} is not an integer scalar"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    #[test]
    fn parses_variables_and_aliases_and_rejects_truncation() {
        let mut file = Vec::new();
        file.extend_from_slice(&6u32.to_le_bytes());
        string(&mut file, "TestSpec");
        file.extend_from_slice(&1u32.to_le_bytes());
        file.extend_from_slice(&2u32.to_le_bytes());
        string(&mut file, "w");
        file.push(1);
        file.extend_from_slice(&2u32.to_le_bytes());
        file.push(0);
        file.extend_from_slice(&8u32.to_le_bytes());
        file.extend_from_slice(&1.5f32.to_le_bytes());
        file.extend_from_slice(&(-2.0f32).to_le_bytes());
        string(&mut file, "heads");
        file.push(0);
        file.push(2);
        file.extend_from_slice(&2u32.to_le_bytes());
        file.extend_from_slice(&6i16.to_le_bytes());
        file.extend_from_slice(&1u32.to_le_bytes());
        string(&mut file, "alias");
        string(&mut file, "w");
        let model = Ct2Model::parse(&file).expect("parses");
        assert_eq!(model.spec, "TestSpec");
        assert_eq!(model.get("alias").expect("alias").dims, vec![2]);
        assert_eq!(model.scalar("heads").expect("scalar"), 6);
        assert!(Ct2Model::parse(&file[..30]).is_err());
        assert!(Ct2Model::parse(b"junk").is_err());
    }
}
