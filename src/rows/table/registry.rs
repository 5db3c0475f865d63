//! [`Tables`], the tables of embedding rows a PS task serves, by table id.

use core::fmt;
use std::sync::Arc;

use crate::service::{Service, Table};

/// The tables a PS task serves, by table id.
#[derive(Clone, Default)]
pub struct Tables {
    /// Sorted by id, ids distinct.
    by_id: Vec<(u32, Arc<dyn Table>)>,
}

impl Tables {
    /// No tables.
    pub fn new() -> Tables {
        Tables::default()
    }

    /// These tables and `table` as `table_id` (replacing a table of that id).
    pub fn with(mut self, table_id: u32, table: Arc<dyn Table>) -> Tables {
        match self.by_id.binary_search_by_key(&table_id, |e| e.0) {
            Ok(i) => self.by_id[i].1 = table,
            Err(i) => self.by_id.insert(i, (table_id, table)),
        }
        self
    }

    /// The table `table_id`, if served.
    pub fn get(&self, table_id: u32) -> Option<&dyn Table> {
        let i = self.by_id.binary_search_by_key(&table_id, |e| e.0).ok()?;
        Some(&*self.by_id[i].1)
    }

    /// The ids of the tables, increasing.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_id.iter().map(|e| e.0)
    }

    /// Number of tables.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are no tables.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

impl fmt::Debug for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.ids()).finish()
    }
}

/// A registry of tables serves their rows; pulls and pushes of tensors by id are
/// `UNIMPLEMENTED`.
impl Service for Tables {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        self.get(table)
    }

    fn table_ids(&self) -> Vec<u32> {
        self.ids().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{Init, MemTable, Optimizer};

    #[test]
    fn tables_registry() {
        let a: Arc<dyn Table> = Arc::new(MemTable::new(2, Init::Zeros, Optimizer::Sgd { lr: 1.0 }));
        let b: Arc<dyn Table> = Arc::new(MemTable::new(5, Init::Zeros, Optimizer::Sgd { lr: 1.0 }));
        let tables = Tables::new().with(7, a.clone()).with(3, b).with(7, a);
        assert_eq!(tables.len(), 2);
        assert_eq!(tables.ids().collect::<Vec<_>>(), [3, 7]);
        assert_eq!(tables.get(3).map(|t| t.row_bytes()), Some(20));
        assert_eq!(tables.get(7).map(|t| t.row_bytes()), Some(8));
        assert!(tables.get(4).is_none());
        assert_eq!(format!("{tables:?}"), "{3, 7}");
        assert!(Tables::new().is_empty());
    }
}
