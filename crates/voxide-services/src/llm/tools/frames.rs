//! The frames a call reports itself with: its results and its cancellation, each both ways (the
//! assistant aggregator downstream, the user side upstream).

use serde_json::Value;

use super::Running;
use crate::llm::ResultProperties;
use voxide_core::frames::{
    CancelReason, DataFrame, Frame, FunctionCallCancel, FunctionCallResult,
    FunctionCallResultProperties, ResultKind, SystemFrame,
};
use voxide_core::pipeline::Direction;

const BOTH_WAYS: [Direction; 2] = [Direction::Downstream, Direction::Upstream];

/// A result of `kind`, both ways.
pub(super) fn result(
    id: &str,
    call: &Running,
    result: Option<Value>,
    kind: ResultKind,
    properties: FunctionCallResultProperties,
) -> Vec<(Frame, Direction)> {
    let result = FunctionCallResult {
        function_name: call.function_name.clone(),
        tool_call_id: id.to_owned(),
        arguments: call.arguments.clone(),
        result,
        kind,
        cancel_on_interruption: call.cancel_on_interruption,
        group_id: call.group_id,
        properties,
    };
    BOTH_WAYS
        .into_iter()
        .map(|dir| {
            let frame = DataFrame::FunctionCallResult(Box::new(result.clone()));
            (Frame::new(frame), dir)
        })
        .collect()
}

/// The cancel frame and an empty cancelled result, both ways.
pub(super) fn cancelled(
    id: &str,
    call: &Running,
    reason: CancelReason,
    run_llm: Option<bool>,
) -> Vec<(Frame, Direction)> {
    let cancel = FunctionCallCancel {
        function_name: call.function_name.clone(),
        tool_call_id: id.to_owned(),
        reason,
    };
    let properties = FunctionCallResultProperties {
        run_llm,
        on_context_updated: None,
    };
    BOTH_WAYS
        .into_iter()
        .map(|dir| {
            let frame = SystemFrame::FunctionCallCancel(Box::new(cancel.clone()));
            (Frame::new(frame), dir)
        })
        .chain(result(id, call, None, ResultKind::Cancelled, properties))
        .collect()
}

/// The properties a result frame carries.
pub(super) fn properties(properties: ResultProperties) -> FunctionCallResultProperties {
    FunctionCallResultProperties {
        run_llm: properties.run_llm,
        on_context_updated: properties.on_context_updated,
    }
}
