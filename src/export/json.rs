//! `--json`: the `threadwise.plan/1` document.

use super::{Context, ExportError, Exporter};
use crate::plan::Plan;

pub(super) struct Json;

impl Exporter<Plan, Context> for Json {
    fn render(&self, plan: &Plan, _: &Context) -> Result<String, ExportError> {
        Ok(serde_json::to_string_pretty(plan)? + "\n")
    }
}
