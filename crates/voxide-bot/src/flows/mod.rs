//! Conversations with a shape: a flow of nodes, each with its own instructions, tools and
//! functions that move the conversation on.
//!
//! A [`Flow`] is the bot file's `[[node]]`s (or a Pipecat Flows JSON file) checked once per bot.
//! Each session follows it with a [`FlowSession`]: the node it is at, the role in force and the
//! state its functions collected (a call's arguments, kept by name, readable in later prompts as
//! `{state.NAME}`). The session registers one handler per flow function over the bot's own
//! tools: the bot tool of that name (if any) does the work, then the node's transition picks the
//! next node, and once the result is in the context the session enters it: the context takes the
//! node's role and task (appended, or the conversation starts over) and only the node's tools.
//! The [`FlowStage`], after the LLM, then says the node's pre-action lines, runs the LLM when the
//! node answers at once, and ends the call after the node's answer when a post-action says so.

mod graph;
mod stage;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::config::flow::{
    ActionConfig, FunctionConfig, MessageConfig, NodeConfig, StrategyConfig, TransitionConfig,
};
use crate::context::{ContextHandle, FunctionSchema, LlmContext, Message, ToolsSchema};
use crate::frames::OnContextUpdated;
use crate::services::llm::{
    FunctionCallParams, FunctionRegistry, LlmEngine, ResultCallback, ResultProperties,
    SUMMARY_INSTRUCTION, write_summary,
};

pub use graph::{mermaid, svg};
use stage::AfterAct;
pub use stage::FlowStage;

/// What a transition-only function answers.
const ACKNOWLEDGED: &str = "acknowledged";
/// Nodes entered but not yet acted on by the stage, at most.
const ENTERED_QUEUE: usize = 16;

/// How the conversation changes on entering a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The node's task joins the conversation so far (the role in force replaces the system
    /// instruction).
    Append,
    /// The conversation starts over from the node's role and task.
    Reset,
    /// As `Reset`, and a summary of what came before joins it once the LLM has written it (in
    /// the background: the node's first answer does not wait for it).
    ResetWithSummary,
}

impl From<StrategyConfig> for Strategy {
    fn from(config: StrategyConfig) -> Self {
        match config {
            StrategyConfig::Append => Strategy::Append,
            StrategyConfig::Reset => Strategy::Reset,
            StrategyConfig::ResetWithSummary => Strategy::ResetWithSummary,
        }
    }
}

/// Where a function's call leads.
#[derive(Debug, Clone, PartialEq)]
enum Transition {
    To(String),
    Branch {
        field: String,
        cases: BTreeMap<String, String>,
        default: Option<String>,
    },
}

impl Transition {
    /// The node the call's `result` leads to; none: the conversation stays.
    fn target(&self, result: Option<&Value>) -> Option<String> {
        match self {
            Transition::To(node) => Some(node.clone()),
            Transition::Branch {
                field,
                cases,
                default,
            } => {
                let value = result.and_then(|r| r.get(field));
                let key = match value {
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(v) => Some(v.to_string()),
                    None => None,
                };
                key.and_then(|k| cases.get(&k).cloned())
                    .or_else(|| default.clone())
            }
        }
    }

    fn targets(&self) -> Vec<&str> {
        match self {
            Transition::To(node) => vec![node],
            Transition::Branch { cases, default, .. } => cases
                .values()
                .chain(default.iter())
                .map(String::as_str)
                .collect(),
        }
    }
}

/// A function offered at a node.
#[derive(Debug, Clone, PartialEq)]
struct Function {
    name: String,
    /// Its own description and arguments; none: the bot tool of its name gives them.
    schema: Option<FunctionSchema>,
    transition: Option<Transition>,
}

impl Function {
    fn new(config: &FunctionConfig, what: &str) -> Result<Self, String> {
        let name = &config.name;
        if !FunctionSchema::is_valid_name(name) {
            return Err(format!(
                "{what}: the function name {name:?} is letters, digits, _ and - only"
            ));
        }
        let schema = match (&config.description, &config.parameters) {
            (None, None) => None,
            (description, parameters) => Some(
                FunctionSchema::from_parameters(
                    name.clone(),
                    description.clone().unwrap_or_default(),
                    parameters.as_ref().unwrap_or(&Value::Null),
                )
                .map_err(|e| format!("{what}: {e}"))?,
            ),
        };
        let transition = config.transition_to.as_ref().map(|t| match t {
            TransitionConfig::Node(node) => Transition::To(node.clone()),
            TransitionConfig::Branch {
                field,
                cases,
                default,
            } => Transition::Branch {
                field: field.clone(),
                cases: cases.clone(),
                default: default.clone(),
            },
        });
        Ok(Self {
            name: name.clone(),
            schema,
            transition,
        })
    }
}

/// Something done on entering a node or after its answer.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    /// Say this line.
    Say(String),
    /// End the call (after what is being said).
    End,
    /// Hand the phone call over (after what is being said): the `[transfer]` destination's
    /// name, then its address once the bot's table has given it.
    Transfer(String, Option<String>),
}

impl Action {
    fn new(config: &ActionConfig, what: &str) -> Result<Self, String> {
        match (config.kind.as_str(), &config.text) {
            ("tts_say", Some(text)) if !text.trim().is_empty() => Ok(Action::Say(text.clone())),
            ("tts_say", _) => Err(format!("{what}: tts_say needs a text")),
            ("end_conversation", _) => Ok(Action::End),
            ("transfer", _) => match &config.destination {
                Some(name) => Ok(Action::Transfer(name.clone(), None)),
                None => Err(format!(
                    "{what}: transfer needs a destination (a name of the bot's [transfer])"
                )),
            },
            (other, _) => Err(format!(
                "{what}: the action {other:?} is not one voxide does (tts_say, end_conversation, \
                 transfer; a function action runs Python)"
            )),
        }
    }
}

/// What the stage does after a node's answer: the first post-action that ends the node's part
/// in the call.
fn after_answer(node: &Node) -> Option<AfterAct> {
    node.post.iter().find_map(|action| match action {
        Action::End => Some(AfterAct::End),
        Action::Transfer(_, Some(to)) => Some(AfterAct::Transfer(to.clone())),
        Action::Say(_) | Action::Transfer(_, None) => None,
    })
}

/// Who says a task message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaker {
    System,
    Developer,
    User,
}

/// One state of the conversation.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    name: String,
    role: Option<String>,
    task: Vec<(Speaker, String)>,
    tools: Vec<String>,
    functions: Vec<Function>,
    pre: Vec<Action>,
    post: Vec<Action>,
    strategy: Option<Strategy>,
    summary_prompt: Option<String>,
    respond_immediately: bool,
}

impl Node {
    fn new(config: &NodeConfig) -> Result<Self, String> {
        let what = format!("node {:?}", config.name);
        if config.name.trim().is_empty() {
            return Err("a node needs a name".into());
        }
        let mut task = Vec::new();
        if let Some(text) = &config.task {
            task.push((Speaker::System, text.clone()));
        }
        for MessageConfig { role, content } in &config.task_messages {
            let speaker = match role.as_str() {
                "system" => Speaker::System,
                "developer" => Speaker::Developer,
                "user" => Speaker::User,
                other => {
                    return Err(format!(
                        "{what}: a task message's role is system, developer or user, not {other:?}"
                    ));
                }
            };
            task.push((speaker, content.clone()));
        }
        let functions = config
            .functions
            .iter()
            .map(|f| Function::new(f, &what))
            .collect::<Result<Vec<_>, _>>()?;
        let actions = |list: &[ActionConfig]| {
            list.iter()
                .map(|a| Action::new(a, &what))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            name: config.name.clone(),
            role: config.role.clone(),
            task,
            tools: config.tools.clone(),
            functions,
            pre: actions(&config.pre_actions)?,
            post: actions(&config.post_actions)?,
            strategy: config.context_strategy.map(Strategy::from),
            summary_prompt: config.summary_prompt.clone(),
            respond_immediately: config.respond_immediately.unwrap_or(true),
        })
    }
}

/// A flow, checked: every transition leads to a node, every action is one voxide does.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    initial: String,
    strategy: Strategy,
    nodes: Vec<Node>,
    global: Vec<Function>,
}

impl Flow {
    /// Gives each `transfer` action its destination's address from the bot's `[transfer]`
    /// (name, address); an error names a destination the table does not list.
    pub fn with_destinations(mut self, destinations: &[(String, String)]) -> Result<Self, String> {
        for node in &mut self.nodes {
            for action in &mut node.post {
                if let Action::Transfer(name, address) = action {
                    let (_, to) = destinations.iter().find(|(n, _)| n == name).ok_or_else(|| {
                        format!(
                            "node {:?} transfers to {name:?}, which the bot's [transfer] does not list",
                            node.name
                        )
                    })?;
                    *address = Some(to.clone());
                }
            }
        }
        Ok(self)
    }

    /// The flow of `nodes`, starting at `initial` (default: the first node).
    pub fn new(
        nodes: &[NodeConfig],
        initial: Option<&str>,
        strategy: Option<StrategyConfig>,
        global: &[FunctionConfig],
    ) -> Result<Self, String> {
        let nodes = nodes.iter().map(Node::new).collect::<Result<Vec<_>, _>>()?;
        let Some(first) = nodes.first() else {
            return Err("a flow needs at least one node".into());
        };
        let initial = initial.unwrap_or(&first.name).to_owned();
        let global = global
            .iter()
            .map(|f| Function::new(f, "global_functions"))
            .collect::<Result<Vec<_>, _>>()?;
        let flow = Self {
            initial,
            strategy: strategy.map_or(Strategy::Append, Strategy::from),
            nodes,
            global,
        };
        for (i, node) in flow.nodes.iter().enumerate() {
            if flow.nodes[..i].iter().any(|n| n.name == node.name) {
                return Err(format!("two nodes are named {:?}", node.name));
            }
        }
        if flow.node(&flow.initial).is_none() {
            return Err(format!("the initial node {:?} is no node", flow.initial));
        }
        for node in &flow.nodes {
            for function in node.functions.iter().chain(&flow.global) {
                for target in function.transition.iter().flat_map(Transition::targets) {
                    if flow.node(target).is_none() {
                        return Err(format!(
                            "node {:?}: {} moves to {target:?}, which is no node",
                            node.name, function.name
                        ));
                    }
                }
            }
        }
        Ok(flow)
    }

    /// The node the conversation starts at.
    pub fn initial(&self) -> &str {
        &self.initial
    }

    /// The nodes' names, in the order given.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.name.as_str())
    }

    /// Whether a node resets the conversation with a summary of it.
    pub fn summarizes(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.strategy == Some(Strategy::ResetWithSummary))
            || self.strategy == Strategy::ResetWithSummary
    }

    /// What a realtime model cannot follow in this flow (it holds the conversation and speaks
    /// itself): a reset, or a line to say.
    pub fn realtime_gap(&self) -> Option<String> {
        let node = self.nodes.iter().find(|n| {
            n.strategy.unwrap_or(self.strategy) != Strategy::Append
                || n.pre.iter().any(|a| matches!(a, Action::Say(_)))
        })?;
        Some(format!(
            "node {:?}: a realtime provider keeps its own conversation and voice, so a flow on \
             one appends (no reset) and says no tts_say lines",
            node.name
        ))
    }

    /// Whether a node offers a tool or function of this name.
    pub fn names(&self, tool: &str) -> bool {
        self.nodes
            .iter()
            .flat_map(|n| n.tools.iter().chain(n.functions.iter().map(|f| &f.name)))
            .chain(self.global.iter().map(|f| &f.name))
            .any(|name| name == tool)
    }

    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// An error naming a node's tool the bot does not have, or a function that is no tool and
    /// moves nowhere; `tools` are the bot's tool names.
    pub fn check_tools(&self, tools: &[String]) -> Result<(), String> {
        let has = |name: &str| tools.iter().any(|t| t == name);
        for node in &self.nodes {
            if let Some(tool) = node.tools.iter().find(|t| !has(t)) {
                return Err(format!(
                    "node {:?} offers the tool {tool:?}, which the bot does not have",
                    node.name
                ));
            }
        }
        let nodes = self.nodes.iter().map(|n| (n.name.as_str(), &n.functions));
        for (node, functions) in nodes.chain(std::iter::once(("global_functions", &self.global))) {
            for f in functions.iter() {
                if f.schema.is_none() && f.transition.is_none() && !has(&f.name) {
                    return Err(format!(
                        "node {node:?}: the function {:?} is no tool of the bot's and moves \
                         nowhere: give the bot a tool of that name, or the function a \
                         description or a transition_to",
                        f.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// Each distinct function name, with its first definition.
    fn functions(&self) -> Vec<&Function> {
        let mut out: Vec<&Function> = Vec::new();
        let all = self
            .nodes
            .iter()
            .flat_map(|n| &n.functions)
            .chain(&self.global);
        for function in all {
            if !out.iter().any(|f| f.name == function.name) {
                out.push(function);
            }
        }
        out
    }
}

/// Where a session is in its flow.
#[derive(Debug)]
struct Progress {
    node: String,
    /// The role in force: the last entered node's that had one.
    role: Option<String>,
    state: Map<String, Value>,
    visited: Vec<String>,
}

/// What the stage does for a node just entered.
#[derive(Debug)]
struct Entered {
    node: String,
    say: Vec<String>,
    respond: bool,
    after_answer: Option<AfterAct>,
}

struct SessionShared {
    flow: Arc<Flow>,
    progress: Mutex<Progress>,
    /// The bot's tools, as the model would see them, by name.
    tools: Mutex<BTreeMap<String, FunctionSchema>>,
    entered: mpsc::Sender<Entered>,
    entered_rx: Mutex<Option<mpsc::Receiver<Entered>>>,
    options: FlowOptions,
}

/// How a session follows its flow.
#[derive(Clone, Default)]
pub struct FlowOptions {
    /// Who writes the summaries of `reset_with_summary`; without one, such a node resets.
    pub summaries: Option<Arc<dyn LlmEngine>>,
    /// The model is a realtime one: each node's role and task become the session's
    /// instructions, the conversation left as it is (the provider holds it; only `append`
    /// applies).
    pub realtime: bool,
}

/// One session's way through a flow.
#[derive(Clone)]
pub struct FlowSession(Arc<SessionShared>);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl FlowSession {
    /// A session at `flow`'s initial node, whose role is `instructions` until a node gives one.
    pub fn new(flow: Arc<Flow>, instructions: &str, options: FlowOptions) -> Self {
        let (entered, entered_rx) = mpsc::channel(ENTERED_QUEUE);
        let initial = flow.initial.clone();
        Self(Arc::new(SessionShared {
            progress: Mutex::new(Progress {
                node: initial.clone(),
                role: Some(instructions.to_owned()).filter(|r| !r.is_empty()),
                state: Map::new(),
                visited: vec![initial],
            }),
            flow,
            tools: Mutex::new(BTreeMap::new()),
            entered,
            entered_rx: Mutex::new(Some(entered_rx)),
            options,
        }))
    }

    /// The node the conversation is at.
    pub fn node(&self) -> String {
        lock(&self.0.progress).node.clone()
    }

    /// The nodes entered so far, the initial one first.
    pub fn visited(&self) -> Vec<String> {
        lock(&self.0.progress).visited.clone()
    }

    /// What the flow's functions collected.
    pub fn state(&self) -> Map<String, Value> {
        lock(&self.0.progress).state.clone()
    }

    /// Takes the bot's tools (already on `registry`) off every request, so each node offers its
    /// own, and answers each flow function: the bot tool of its name does the work, then the
    /// transition of the node the conversation is at moves it on.
    pub fn register(&self, registry: &mut FunctionRegistry) {
        let schemas = registry.withhold_schemas();
        *lock(&self.0.tools) = schemas.into_iter().map(|s| (s.name.clone(), s)).collect();
        for function in self.0.flow.functions() {
            let tool = registry.get(&function.name).cloned();
            let options = tool.as_ref().map(|t| t.options.clone()).unwrap_or_default();
            let session = self.clone();
            registry.register_function(
                Some(&function.name),
                move |params: FunctionCallParams| {
                    let session = session.clone();
                    let tool = tool.clone();
                    async move { session.call(params, tool).await }
                },
                options,
            );
        }
    }

    /// The conversation at the initial node: its role and task, and its tools.
    pub fn initial_context(&self) -> LlmContext {
        let flow = &self.0.flow;
        let node = flow.node(&flow.initial).expect("checked at Flow::new");
        let mut progress = lock(&self.0.progress);
        if node.role.is_some() {
            progress.role.clone_from(&node.role);
        }
        let mut context = LlmContext::new(Vec::new());
        self.apply(node, Strategy::Reset, &progress, &mut context);
        context
    }

    /// The stage that acts on entered nodes, after the LLM; `context` is the session's.
    pub fn stage(&self, context: ContextHandle) -> FlowStage {
        let entered = lock(&self.0.entered_rx).take();
        let node = {
            let flow = &self.0.flow;
            flow.node(&flow.initial).expect("checked at Flow::new")
        };
        let first = Entered {
            node: node.name.clone(),
            say: says(node),
            respond: node.respond_immediately,
            after_answer: after_answer(node),
        };
        FlowStage::new(context, first, entered)
    }

    /// The function a call names, as the node the conversation is at defines it.
    fn function(&self, name: &str) -> Option<Function> {
        let flow = &self.0.flow;
        let progress = lock(&self.0.progress);
        let node = flow.node(&progress.node)?;
        node.functions
            .iter()
            .chain(&flow.global)
            .find(|f| f.name == name)
            .cloned()
    }

    async fn call(
        self,
        params: FunctionCallParams,
        tool: Option<crate::services::llm::Registered>,
    ) {
        let function = self.function(&params.function_name);
        if function.is_some()
            && let Value::Object(arguments) = &params.arguments
        {
            let mut progress = lock(&self.0.progress);
            for (key, value) in arguments {
                progress.state.insert(key.clone(), value.clone());
            }
        }
        let result = match tool {
            Some(tool) => run_tool(tool, &params).await,
            None => Some(json!({ "status": ACKNOWLEDGED })),
        };
        let target = function
            .and_then(|f| f.transition)
            .and_then(|t| t.target(result.as_ref()));
        let mut properties = ResultProperties::final_result();
        if let Some(target) = target {
            // The stage runs the LLM once the node is entered (or not, as the node says).
            properties.run_llm = Some(false);
            let session = self.clone();
            let context = params.context.clone();
            properties.on_context_updated = Some(OnContextUpdated::new(move || {
                session.enter(&target, &context);
            }));
        }
        params.result_callback.deliver(result, properties);
    }

    /// Moves the conversation to the node `name`: the context takes its role, task and tools,
    /// and the stage hears what to do.
    fn enter(&self, name: &str, context: &ContextHandle) {
        let flow = &self.0.flow;
        let Some(node) = flow.node(name) else {
            return;
        };
        let mut progress = lock(&self.0.progress);
        if node.role.is_some() {
            progress.role.clone_from(&node.role);
        }
        progress.node = name.to_owned();
        progress.visited.push(name.to_owned());
        let strategy = node.strategy.unwrap_or(flow.strategy);
        let earlier = {
            let mut context = context.lock();
            let earlier = (strategy == Strategy::ResetWithSummary).then(|| {
                let summary = context.summary().map(str::to_owned);
                let said: Vec<Message> = context
                    .messages
                    .iter()
                    .filter(|m| !matches!(m, Message::System(_) | Message::Developer(_)))
                    .cloned()
                    .collect();
                (summary, said)
            });
            self.apply(node, strategy, &progress, &mut context);
            earlier
        };
        if let Some((summary, said)) = earlier {
            self.summarize(node, summary, said, context.clone());
        }
        tracing::info!(node = name, ?strategy, "the flow moves on");
        let entered = Entered {
            node: name.to_owned(),
            say: says(node),
            respond: node.respond_immediately,
            after_answer: after_answer(node),
        };
        if self.0.entered.try_send(entered).is_err() {
            tracing::warn!(
                node = name,
                "the flow's stage is gone or far behind: the node's actions are dropped"
            );
        }
    }

    /// Has the summary of what was said before `node` written in the background, and puts it in
    /// `context` once it is.
    fn summarize(
        &self,
        node: &Node,
        earlier: Option<String>,
        said: Vec<Message>,
        context: ContextHandle,
    ) {
        let Some(engine) = self.0.options.summaries.clone() else {
            tracing::warn!(
                node = node.name,
                "no LLM writes this flow's summaries: the node resets"
            );
            return;
        };
        if said.is_empty() && earlier.is_none() {
            return;
        }
        let prompt = node
            .summary_prompt
            .clone()
            .unwrap_or_else(|| SUMMARY_INSTRUCTION.to_owned());
        let name = node.name.clone();
        tokio::spawn(async move {
            match write_summary(engine.as_ref(), &prompt, earlier.as_deref(), &said).await {
                Ok(summary) => {
                    tracing::info!(
                        node = name,
                        chars = summary.len(),
                        "the summary of what came before the node joins it"
                    );
                    context.lock().set_summary(summary);
                }
                Err(why) => {
                    tracing::warn!(node = name, %why, "no summary of the conversation before the node")
                }
            }
        });
    }

    /// `context` at `node` with `strategy`.
    fn apply(
        &self,
        node: &Node,
        strategy: Strategy,
        progress: &Progress,
        context: &mut LlmContext,
    ) {
        let role = progress
            .role
            .as_deref()
            .map(|r| Message::system(expand(r, &progress.state)));
        let task = node.task.iter().map(|(speaker, text)| {
            let text = expand(text, &progress.state);
            match speaker {
                Speaker::System => Message::system(text),
                Speaker::Developer => Message::developer(text),
                Speaker::User => Message::user(text),
            }
        });
        if self.0.options.realtime {
            let head = context
                .messages
                .iter()
                .take_while(|m| matches!(m, Message::System(_) | Message::Developer(_)))
                .count();
            let task = task.map(|m| match m {
                Message::User(_) => Message::system(m.text().unwrap_or_default()),
                other => other,
            });
            let instructions: Vec<Message> = role.into_iter().chain(task).collect();
            context.messages.splice(..head, instructions);
            context.tools = self.tools_at(node);
            return;
        }
        match strategy {
            Strategy::Reset | Strategy::ResetWithSummary => {
                context.messages = role.into_iter().chain(task).collect();
            }
            Strategy::Append => {
                if let Some(role) = role {
                    match context.messages.first_mut() {
                        Some(first @ Message::System(_)) => *first = role,
                        _ => context.messages.insert(0, role),
                    }
                }
                context.messages.extend(task);
            }
        }
        context.tools = self.tools_at(node);
    }

    /// What the model is offered at `node`: its tools, its functions, the global functions.
    fn tools_at(&self, node: &Node) -> ToolsSchema {
        let tools = lock(&self.0.tools);
        let mut offered: Vec<FunctionSchema> = node
            .tools
            .iter()
            .filter_map(|name| tools.get(name).cloned())
            .collect();
        for function in node.functions.iter().chain(&self.0.flow.global) {
            if offered.iter().any(|s| s.name == function.name) {
                continue;
            }
            let schema = function
                .schema
                .clone()
                .or_else(|| tools.get(&function.name).cloned())
                .unwrap_or_else(|| {
                    let to = function
                        .transition
                        .as_ref()
                        .map(|t| t.targets().join(" or "))
                        .unwrap_or_default();
                    FunctionSchema::new(
                        function.name.clone(),
                        format!("Moves the conversation on to {to}."),
                    )
                });
            offered.push(schema);
        }
        ToolsSchema::new(offered)
    }
}

/// The lines a node's pre-actions say.
fn says(node: &Node) -> Vec<String> {
    node.pre
        .iter()
        .filter_map(|a| match a {
            Action::Say(text) => Some(text.clone()),
            Action::End | Action::Transfer(..) => None,
        })
        .collect()
}

/// Runs a bot tool for a flow function and returns its final result; intermediate results go
/// on to `params`' callback as they come.
async fn run_tool(
    tool: crate::services::llm::Registered,
    params: &FunctionCallParams,
) -> Option<Value> {
    let (callback, mut rx) = ResultCallback::channel();
    let inner = FunctionCallParams {
        function_name: params.function_name.clone(),
        tool_call_id: params.tool_call_id.clone(),
        arguments: params.arguments.clone(),
        context: params.context.clone(),
        app_resources: params.app_resources.clone(),
        result_callback: callback,
    };
    let outer = params.result_callback.clone();
    let collect = async move {
        while let Some(delivered) = rx.recv().await {
            if delivered.properties.is_final {
                return delivered.result;
            }
            outer.deliver(delivered.result, ResultProperties::intermediate());
        }
        None
    };
    let ((), result) = tokio::join!((tool.handler)(inner), collect);
    result
}

/// `text` with each `{state.NAME}` replaced by what the flow collected under `NAME` (text as it
/// is, anything else as JSON); an unknown name stays as written.
fn expand(text: &str, state: &Map<String, Value>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{state.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "{state.".len()..];
        match after.find('}') {
            Some(end) => {
                let name = &after[..end];
                match state.get(name) {
                    Some(Value::String(s)) => out.push_str(s),
                    Some(v) => out.push_str(&v.to_string()),
                    None => out.push_str(&rest[start..start + "{state.".len() + end + 1]),
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_in_a_prompt_are_filled_in_and_unknown_ones_kept() {
        let mut state = Map::new();
        state.insert("party_size".into(), json!(4));
        state.insert("date".into(), json!("Friday"));
        assert_eq!(
            expand(
                "{state.party_size} on {state.date}, {state.nope} {state.",
                &state
            ),
            "4 on Friday, {state.nope} {state."
        );
    }

    #[test]
    fn a_branch_picks_its_node_by_the_results_field_as_text() {
        let branch = Transition::Branch {
            field: "available".into(),
            cases: [
                ("true".into(), "book".into()),
                ("false".into(), "other".into()),
            ]
            .into(),
            default: None,
        };
        assert_eq!(
            branch.target(Some(&json!({"available": true}))).as_deref(),
            Some("book")
        );
        assert_eq!(
            branch.target(Some(&json!({"available": false}))).as_deref(),
            Some("other")
        );
        assert_eq!(branch.target(Some(&json!({}))), None);
        assert_eq!(branch.target(None), None);
    }

    #[test]
    fn a_flow_that_leads_nowhere_or_does_what_voxide_cannot_is_an_error() {
        let node = |name: &str, to: &str| NodeConfig {
            name: name.into(),
            functions: vec![FunctionConfig {
                name: "go".into(),
                transition_to: Some(TransitionConfig::Node(to.into())),
                ..FunctionConfig::default()
            }],
            ..NodeConfig::default()
        };
        assert!(Flow::new(&[node("a", "a")], None, None, &[]).is_ok());
        let e = Flow::new(&[node("a", "b")], None, None, &[]).expect_err("no b");
        assert!(e.contains("\"b\""), "{e}");
        let e = Flow::new(&[node("a", "a")], Some("z"), None, &[]).expect_err("no z");
        assert!(e.contains("\"z\""), "{e}");
        assert!(Flow::new(&[node("a", "a"), node("a", "a")], None, None, &[]).is_err());
        let mut acting = node("a", "a");
        acting.post_actions = vec![ActionConfig {
            kind: "function".into(),
            text: None,
            destination: None,
            rest: Map::new(),
        }];
        let e = Flow::new(&[acting], None, None, &[]).expect_err("python");
        assert!(e.contains("\"function\""), "{e}");
    }

    #[test]
    fn a_node_offering_a_tool_the_bot_lacks_is_named() {
        let flow = Flow::new(
            &[NodeConfig {
                name: "a".into(),
                tools: vec!["lookup".into()],
                functions: vec![FunctionConfig {
                    name: "book".into(),
                    ..FunctionConfig::default()
                }],
                ..NodeConfig::default()
            }],
            None,
            None,
            &[],
        )
        .expect("flow");
        let e = flow.check_tools(&["book".into()]).expect_err("no lookup");
        assert!(e.contains("lookup"), "{e}");
        let e = flow
            .check_tools(&["lookup".into()])
            .expect_err("book does nothing");
        assert!(e.contains("book"), "{e}");
        assert!(flow.check_tools(&["lookup".into(), "book".into()]).is_ok());
    }
}
