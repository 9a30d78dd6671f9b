//! A small row-wise builder for Arrow record batches with a fixed schema.

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, UInt32Builder,
    UInt64Builder, make_builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use std::sync::Arc;

/// Column types used by the output tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColType {
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// Boolean.
    Bool,
    /// UTF-8 string.
    Str,
    /// Bytes.
    Bin,
}

impl ColType {
    fn data_type(self) -> DataType {
        match self {
            ColType::U32 => DataType::UInt32,
            ColType::U64 => DataType::UInt64,
            ColType::I64 => DataType::Int64,
            ColType::F64 => DataType::Float64,
            ColType::Bool => DataType::Boolean,
            ColType::Str => DataType::Utf8,
            ColType::Bin => DataType::Binary,
        }
    }
}

/// One value of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell<'a> {
    /// Missing.
    Null,
    /// See [`ColType::U32`].
    U32(u32),
    /// See [`ColType::U64`].
    U64(u64),
    /// See [`ColType::I64`].
    I64(i64),
    /// See [`ColType::F64`].
    F64(f64),
    /// See [`ColType::Bool`].
    Bool(bool),
    /// See [`ColType::Str`].
    Str(&'a str),
    /// See [`ColType::Bin`].
    Bin(&'a [u8]),
}

/// Builds a record batch row by row.
pub struct TableBuilder {
    schema: SchemaRef,
    types: Vec<ColType>,
    cols: Vec<Box<dyn ArrayBuilder>>,
}

impl TableBuilder {
    /// A builder for columns `(name, type)`; every column is nullable.
    pub fn new(columns: &[(String, ColType)]) -> TableBuilder {
        let fields: Vec<Field> = columns.iter().map(|(n, t)| Field::new(n, t.data_type(), true)).collect();
        TableBuilder {
            schema: Arc::new(Schema::new(fields)),
            types: columns.iter().map(|c| c.1).collect(),
            cols: columns.iter().map(|(_, t)| make_builder(&t.data_type(), 64)).collect(),
        }
    }

    /// The schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Rows appended so far.
    pub fn len(&self) -> usize {
        self.cols.first().map_or(0, |c| c.len())
    }

    /// True before the first row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends one row; panics if a cell does not match its column (a bug in the table definition).
    pub fn push(&mut self, row: &[Cell<'_>]) {
        assert_eq!(row.len(), self.cols.len(), "row width does not match the schema");
        for ((b, &ty), cell) in self.cols.iter_mut().zip(&self.types).zip(row) {
            let any = b.as_any_mut();
            macro_rules! put {
                ($builder:ty, $v:expr) => {
                    any.downcast_mut::<$builder>().expect("builder type matches the column").append_option($v)
                };
            }
            match (ty, *cell) {
                (ColType::U32, Cell::U32(v)) => put!(UInt32Builder, Some(v)),
                (ColType::U32, Cell::Null) => put!(UInt32Builder, None::<u32>),
                (ColType::U64, Cell::U64(v)) => put!(UInt64Builder, Some(v)),
                (ColType::U64, Cell::Null) => put!(UInt64Builder, None::<u64>),
                (ColType::I64, Cell::I64(v)) => put!(Int64Builder, Some(v)),
                (ColType::I64, Cell::Null) => put!(Int64Builder, None::<i64>),
                // A missing number is null, never NaN: NaN poisons sums and
                // means in polars and DuckDB, null is skipped.
                (ColType::F64, Cell::F64(v)) => put!(Float64Builder, (!v.is_nan()).then_some(v)),
                (ColType::F64, Cell::Null) => put!(Float64Builder, None::<f64>),
                (ColType::Bool, Cell::Bool(v)) => put!(BooleanBuilder, Some(v)),
                (ColType::Bool, Cell::Null) => put!(BooleanBuilder, None::<bool>),
                (ColType::Str, Cell::Str(v)) => put!(StringBuilder, Some(v)),
                (ColType::Str, Cell::Null) => put!(StringBuilder, None::<&str>),
                (ColType::Bin, Cell::Bin(v)) => put!(BinaryBuilder, Some(v)),
                (ColType::Bin, Cell::Null) => put!(BinaryBuilder, None::<&[u8]>),
                (ty, cell) => panic!("cell {cell:?} does not fit a {ty:?} column"),
            }
        }
    }

    /// The rows so far as a batch; the builder starts over empty.
    pub fn finish(&mut self) -> RecordBatch {
        let arrays: Vec<ArrayRef> = self.cols.iter_mut().map(|b| b.finish()).collect();
        RecordBatch::try_new(self.schema.clone(), arrays).expect("columns built to the schema")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, StringArray, UInt32Array};

    #[test]
    fn rows_become_typed_nullable_columns() {
        let mut t = TableBuilder::new(&[("id".into(), ColType::U32), ("name".into(), ColType::Str)]);
        t.push(&[Cell::U32(1), Cell::Str("a")]);
        t.push(&[Cell::U32(2), Cell::Null]);
        assert_eq!(t.len(), 2);
        let b = t.finish();
        assert_eq!(b.num_rows(), 2);
        let ids = b.column(0).as_any().downcast_ref::<UInt32Array>().unwrap();
        assert_eq!(ids.values(), &[1, 2]);
        let names = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert!(names.is_null(1));
        assert!(t.is_empty());
    }
}
