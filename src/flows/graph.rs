//! A picture of a flow: Mermaid text, and an SVG drawn from it.

use super::Flow;

/// The flow as a Mermaid state diagram.
pub fn mermaid(flow: &Flow) -> String {
    let _ = flow;
    String::new()
}

/// The flow as an SVG.
pub fn svg(flow: &Flow) -> String {
    let _ = flow;
    String::new()
}
