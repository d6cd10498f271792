//! A picture of a flow for a person to review: Mermaid text, and an SVG drawn here (no
//! renderer needed). Nodes stand in columns by their distance from the initial node; each
//! function that moves the talk on is an arrow labelled with its name, a branch's arrows with
//! the case too; a node whose post-actions end the call points to the end.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{Action, Flow, Transition};

/// One arrow: from, to (none: the call ends), label.
struct Edge<'a> {
    from: &'a str,
    to: Option<&'a str>,
    label: String,
}

fn edges(flow: &Flow) -> Vec<Edge<'_>> {
    let mut out = Vec::new();
    for node in &flow.nodes {
        for function in node.functions.iter().chain(&flow.global) {
            match &function.transition {
                None => {}
                Some(Transition::To(to)) => out.push(Edge {
                    from: &node.name,
                    to: Some(to),
                    label: function.name.clone(),
                }),
                Some(Transition::Branch {
                    field,
                    cases,
                    default,
                }) => {
                    for (case, to) in cases {
                        out.push(Edge {
                            from: &node.name,
                            to: Some(to),
                            label: format!("{} ({field} = {case})", function.name),
                        });
                    }
                    if let Some(to) = default {
                        out.push(Edge {
                            from: &node.name,
                            to: Some(to),
                            label: format!("{} (otherwise)", function.name),
                        });
                    }
                }
            }
        }
        for action in &node.post {
            let label = match action {
                Action::End => "end_conversation".to_owned(),
                Action::Transfer(name, _) => format!("transfer: {name}"),
                Action::Say(_) => continue,
            };
            out.push(Edge {
                from: &node.name,
                to: None,
                label,
            });
        }
    }
    out
}

/// A Mermaid identifier for a node name.
fn id(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'n');
    }
    out
}

/// Text that cannot break Mermaid's syntax.
fn mermaid_text(text: &str) -> String {
    text.replace(['"', ':', ';', '\n'], " ")
}

/// The flow as a Mermaid state diagram.
pub fn mermaid(flow: &Flow) -> String {
    let mut out = String::from("stateDiagram-v2\n");
    for node in &flow.nodes {
        let _ = writeln!(
            out,
            "    state \"{}\" as {}",
            mermaid_text(&node.name),
            id(&node.name)
        );
    }
    let _ = writeln!(out, "    [*] --> {}", id(&flow.initial));
    for edge in edges(flow) {
        let to = edge.to.map_or_else(|| "[*]".to_owned(), id);
        let _ = writeln!(
            out,
            "    {} --> {to}: {}",
            id(edge.from),
            mermaid_text(&edge.label)
        );
    }
    out
}

const BOX_W: f64 = 200.0;
const BOX_H: f64 = 64.0;
const COL_GAP: f64 = 120.0;
const ROW_GAP: f64 = 48.0;
const MARGIN: f64 = 40.0;

fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// At most `n` characters of `text`, with an ellipsis when cut.
fn clip(text: &str, n: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() <= n {
        return text;
    }
    let mut out: String = text.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Each node's column (its distance from the initial node; unreachable ones after the rest)
/// and row.
fn layout(flow: &Flow) -> BTreeMap<&str, (usize, usize)> {
    let edges = edges(flow);
    let mut column: BTreeMap<&str, usize> = BTreeMap::new();
    column.insert(&flow.initial, 0);
    let mut frontier = vec![flow.initial.as_str()];
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for from in frontier {
            let depth = column[from];
            for edge in edges.iter().filter(|e| e.from == from) {
                if let Some(to) = edge.to
                    && !column.contains_key(to)
                {
                    column.insert(to, depth + 1);
                    next.push(to);
                }
            }
        }
        frontier = next;
    }
    let unreachable = column.values().max().map_or(0, |m| m + 1);
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for node in &flow.nodes {
        let col = column
            .get(node.name.as_str())
            .copied()
            .unwrap_or(unreachable);
        let row = rows.entry(col).or_default();
        out.insert(node.name.as_str(), (col, *row));
        *row += 1;
    }
    out
}

/// The flow as an SVG picture.
pub fn svg(flow: &Flow) -> String {
    let places = layout(flow);
    let cols = places.values().map(|p| p.0).max().unwrap_or(0) + 1;
    let rows = places.values().map(|p| p.1).max().unwrap_or(0) + 1;
    // The end of the call gets a column of its own.
    let width = MARGIN * 2.0 + (cols + 1) as f64 * (BOX_W + COL_GAP);
    let height = MARGIN * 2.0 + rows as f64 * (BOX_H + ROW_GAP) + 60.0;
    let at = |col: usize, row: usize| {
        (
            MARGIN + col as f64 * (BOX_W + COL_GAP),
            MARGIN + 40.0 + row as f64 * (BOX_H + ROW_GAP),
        )
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\">\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"8\" \
         markerHeight=\"8\" orient=\"auto-start-reverse\"><path d=\"M0 0L10 5L0 10z\" fill=\"#555\"/>\
         </marker></defs>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n"
    );
    let end = at(cols, 0);
    let end_center = (end.0 + 30.0, end.1 + BOX_H / 2.0);
    // Arrows first, so boxes sit over them.
    for (i, edge) in edges(flow).iter().enumerate() {
        let (fc, fr) = places[edge.from];
        let from = at(fc, fr);
        let (start, finish, forward) = match edge.to {
            Some(to) => {
                let (tc, tr) = places[to];
                let target = at(tc, tr);
                if tc > fc {
                    (
                        (from.0 + BOX_W, from.1 + BOX_H / 2.0),
                        (target.0, target.1 + BOX_H / 2.0),
                        true,
                    )
                } else {
                    // Back (or to itself): under the boxes.
                    (
                        (from.0 + BOX_W * 0.6, from.1 + BOX_H),
                        (target.0 + BOX_W * 0.4, target.1 + BOX_H),
                        false,
                    )
                }
            }
            None => (
                (from.0 + BOX_W, from.1 + BOX_H / 2.0),
                (end_center.0 - 14.0, end_center.1),
                true,
            ),
        };
        let path = if forward {
            let mid = (start.0 + finish.0) / 2.0;
            format!(
                "M{:.1} {:.1}C{mid:.1} {:.1} {mid:.1} {:.1} {:.1} {:.1}",
                start.0, start.1, start.1, finish.1, finish.0, finish.1
            )
        } else {
            let dip = start.1.max(finish.1) + 36.0 + (i % 3) as f64 * 10.0;
            format!(
                "M{:.1} {:.1}C{:.1} {dip:.1} {:.1} {dip:.1} {:.1} {:.1}",
                start.0, start.1, start.0, finish.0, finish.0, finish.1
            )
        };
        let label_at = if forward {
            ((start.0 + finish.0) / 2.0, (start.1 + finish.1) / 2.0 - 6.0)
        } else {
            (
                (start.0 + finish.0) / 2.0,
                start.1.max(finish.1) + 30.0 + (i % 3) as f64 * 10.0,
            )
        };
        let _ = writeln!(
            out,
            "<path class=\"edge\" d=\"{path}\" fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" \
             marker-end=\"url(#arrow)\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" \
             text-anchor=\"middle\" fill=\"#333\">{}</text>",
            label_at.0,
            label_at.1,
            xml(&clip(&edge.label, 40))
        );
    }
    // The start and the end.
    let first = places[flow.initial.as_str()];
    let first = at(first.0, first.1);
    let _ = writeln!(
        out,
        "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"#222\"/>\n<path d=\"M{:.1} {:.1}V{:.1}\" \
         stroke=\"#555\" stroke-width=\"1.5\" marker-end=\"url(#arrow)\"/>",
        first.0 + BOX_W / 2.0,
        first.1 - 34.0,
        first.0 + BOX_W / 2.0,
        first.1 - 27.0,
        first.1
    );
    let leaves = |a: &Action| matches!(a, Action::End | Action::Transfer(..));
    if flow.nodes.iter().any(|n| n.post.iter().any(leaves)) {
        let _ = writeln!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"12\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\"/>\
             <circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"#222\"/>",
            end_center.0, end_center.1, end_center.0, end_center.1
        );
    }
    for node in &flow.nodes {
        let (col, row) = places[node.name.as_str()];
        let (x, y) = at(col, row);
        let task = node
            .task
            .first()
            .map(|(_, t)| t.as_str())
            .unwrap_or_default();
        let fill = if node.name == flow.initial {
            "#e8f0fe"
        } else {
            "#f6f6f6"
        };
        let _ = writeln!(
            out,
            "<g class=\"node\"><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"8\" \
             fill=\"{fill}\" stroke=\"#333\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" \
             font-weight=\"bold\">{}</text><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" \
             fill=\"#555\">{}</text><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#555\">{}</text></g>",
            x + 10.0,
            y + 22.0,
            xml(&clip(&node.name, 24)),
            x + 10.0,
            y + 40.0,
            xml(&clip(task, 34)),
            x + 10.0,
            y + 54.0,
            xml(&clip(&tools_line(node), 34)),
        );
    }
    out.push_str("</svg>\n");
    out
}

/// What a node offers besides its moves, in a line.
fn tools_line(node: &super::Node) -> String {
    if node.tools.is_empty() {
        return String::new();
    }
    format!("tools: {}", node.tools.join(", "))
}

#[cfg(test)]
mod tests {
    use crate::config::flow::{ActionConfig, FunctionConfig, NodeConfig, TransitionConfig};

    use super::*;

    fn flow() -> Flow {
        let go = |name: &str, to: &str| FunctionConfig {
            name: name.into(),
            transition_to: Some(TransitionConfig::Node(to.into())),
            ..FunctionConfig::default()
        };
        let nodes = [
            NodeConfig {
                name: "greet & ask".into(),
                task: Some("Say <hello>.".into()),
                functions: vec![go("on", "done")],
                ..NodeConfig::default()
            },
            NodeConfig {
                name: "done".into(),
                functions: vec![go("again", "greet & ask")],
                post_actions: vec![ActionConfig {
                    kind: "end_conversation".into(),
                    text: None,
                    destination: None,
                    rest: Default::default(),
                }],
                ..NodeConfig::default()
            },
        ];
        Flow::new(&nodes, None, None, &[]).expect("flow")
    }

    #[test]
    fn mermaid_names_every_node_and_move_with_safe_ids() {
        let text = mermaid(&flow());
        assert_eq!(
            text,
            "stateDiagram-v2\n    state \"greet & ask\" as greet___ask\n    state \"done\" as done\n    \
             [*] --> greet___ask\n    greet___ask --> done: on\n    done --> greet___ask: again\n    \
             done --> [*]: end_conversation\n"
        );
    }

    #[test]
    fn the_svg_draws_each_node_and_arrow_with_its_text_escaped() {
        let svg = svg(&flow());
        assert_eq!(svg.matches("class=\"node\"").count(), 2);
        assert_eq!(svg.matches("class=\"edge\"").count(), 3);
        assert!(
            svg.contains("greet &amp; ask") && svg.contains("Say &lt;hello&gt;."),
            "{svg}"
        );
        assert!(!svg.contains("<hello>"));
    }
}
