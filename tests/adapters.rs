//! One conversation through every provider adapter: the request each provider would get.

use serde_json::{Value, json};

use voxide::context::adapters::{anthropic, gemini, openai, openai_realtime};
use voxide::context::async_tool_messages::{
    build_final_result_message, build_intermediate_result_message, build_started_message,
};
use voxide::context::{
    AdapterKind, FunctionSchema, LlmContext, Message, ToolCall, ToolChoice, ToolsSchema,
};

/// A conversation with everything an adapter must handle: instructions, text and image input,
/// text before a call, a sync call and result, an async call with started, partial and final
/// messages, another provider's message, and a closing user message.
fn conversation() -> LlmContext {
    let image: Message = serde_json::from_value(json!({"role": "user", "content": [
        {"type": "text", "text": "and this picture"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0"}}
    ]}))
    .expect("parses");
    let messages = vec![
        Message::system("You are helpful."),
        Message::user("Weather in Paris, and a one-minute timer?"),
        image,
        Message::assistant("Checking."),
        call("w1", "get_weather", json!({"city": "Paris"})),
        Message::tool("w1", "{\"temp\":21}"),
        call("t1", "set_timer", json!({"seconds": 60})),
        build_started_message("t1"),
        build_intermediate_result_message("t1", Some(&json!({"remaining": 30}))),
        Message::assistant("It's 21 degrees."),
        build_final_result_message("t1", Some(&json!({"rang": true}))),
        serde_json::from_value(json!({"role": "llm_specific", "llm": "anthropic",
            "message": {"role": "user", "content": [{"type": "text", "text": "anthropic only"}]}}))
        .expect("parses"),
        Message::user("thanks"),
    ];
    let mut tools = ToolsSchema::new(vec![
        FunctionSchema::new("get_weather", "Current weather.").property(
            "city",
            json!({"type": "string"}),
            true,
        ),
        FunctionSchema::new("set_timer", "Starts a timer.").property(
            "seconds",
            json!({"type": "integer"}),
            true,
        ),
    ]);
    tools
        .custom_tools
        .insert(AdapterKind::Gemini, vec![json!({"googleSearch": {}})]);
    LlmContext {
        messages,
        tools,
        tool_choice: Some(ToolChoice::Auto),
    }
}

fn call(id: &str, name: &str, arguments: Value) -> Message {
    Message::Assistant(voxide::context::AssistantMessage {
        tool_calls: Some(vec![ToolCall::function(id, name, &arguments)]),
        ..Default::default()
    })
}

/// The content strings of the async-tool messages: (started, intermediate, final).
fn async_texts(ctx: &LlmContext) -> (String, String, String) {
    let text = |i: usize| ctx.messages[i].text().expect("text").to_owned();
    (text(7), text(8), text(10))
}

#[test]
fn openai_gets_the_context_as_it_is_without_other_providers_messages() {
    let ctx = conversation();
    let body = openai::request(&ctx.messages, &ctx.tools, ctx.tool_choice.as_ref())
        .expect("a valid request");
    let expected: Vec<Value> = ctx
        .messages
        .iter()
        .filter(|m| m.role() != "llm_specific")
        .map(|m| serde_json::to_value(m).expect("json"))
        .collect();
    assert_eq!(body["messages"], Value::Array(expected));
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(12));
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }})
    );
    assert_eq!(
        body["tools"].as_array().map(Vec::len),
        Some(2),
        "no Gemini tool"
    );
    assert_eq!(body["tool_choice"], "auto");
}

#[test]
fn anthropic_splits_the_system_prompt_uses_blocks_and_merges_roles() {
    let ctx = conversation();
    let (started, partial, fin) = async_texts(&ctx);
    let body = anthropic::request(&ctx.messages, &ctx.tools, ctx.tool_choice.as_ref())
        .expect("a valid request");
    assert_eq!(body["system"], "You are helpful.");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "Weather in Paris, and a one-minute timer?"},
                {"type": "text", "text": "and this picture"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0"}}
            ]},
            // Parallel calls in one assistant turn, their results in the one user turn after.
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "w1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t1", "name": "set_timer", "input": {"seconds": 60}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "w1", "content": "{\"temp\":21}"},
                {"type": "tool_result", "tool_use_id": "t1", "content": started},
                {"type": "text", "text": partial}
            ]},
            {"role": "assistant", "content": [{"type": "text", "text": "It's 21 degrees."}]},
            {"role": "user", "content": [
                {"type": "text", "text": fin},
                {"type": "text", "text": "anthropic only"},
                {"type": "text", "text": "thanks"}
            ]}
        ])
    );
    assert_eq!(
        body["tools"][1],
        json!({"name": "set_timer", "description": "Starts a timer.", "input_schema":
            {"type": "object", "properties": {"seconds": {"type": "integer"}}, "required": ["seconds"]}})
    );
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
}

#[test]
fn gemini_gets_parts_function_calls_and_named_function_responses() {
    let ctx = conversation();
    let (started, partial, fin) = async_texts(&ctx);
    let started: Value = serde_json::from_str(&started).expect("started is JSON");
    let body = gemini::request(&ctx.messages, &ctx.tools, ctx.tool_choice.as_ref())
        .expect("a valid request");
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "You are helpful."}]})
    );
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [
                {"text": "Weather in Paris, and a one-minute timer?"},
                {"text": "and this picture"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0"}}
            ]},
            {"role": "model", "parts": [
                {"text": "Checking."},
                {"functionCall": {"id": "w1", "name": "get_weather", "args": {"city": "Paris"}}},
                {"functionCall": {"id": "t1", "name": "set_timer", "args": {"seconds": 60}}}
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "w1", "name": "get_weather", "response": {"temp": 21}}},
                {"functionResponse": {"id": "t1", "name": "set_timer", "response": started}},
                {"text": partial}
            ]},
            {"role": "model", "parts": [{"text": "It's 21 degrees."}]},
            {"role": "user", "parts": [{"text": fin}, {"text": "thanks"}]}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([
            {"functionDeclarations": [
                {"name": "get_weather", "description": "Current weather.", "parameters":
                    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                {"name": "set_timer", "description": "Starts a timer.", "parameters":
                    {"type": "object", "properties": {"seconds": {"type": "integer"}}, "required": ["seconds"]}}
            ]},
            {"googleSearch": {}}
        ])
    );
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "AUTO"}})
    );
}

#[test]
fn openai_realtime_gets_items_with_async_results_on_the_tool_channel() {
    let ctx = conversation();
    assert_eq!(
        openai_realtime::instructions(&ctx.messages).as_deref(),
        Some("You are helpful.")
    );
    let items = openai_realtime::items(&ctx.messages);
    let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "message:1",
            "message:2",
            "message:3",
            "call:w1",
            "output:w1",
            "call:t1",
            "partial:t1:1",
            "message:9",
            "output:t1",
            "message:12"
        ]
    );
    let item = |key: &str| {
        items
            .iter()
            .find(|i| i.key == key)
            .map(|i| i.item.clone())
            .expect("item")
    };
    assert_eq!(
        item("message:2"),
        json!({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "and this picture"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0"}
        ]})
    );
    assert_eq!(
        item("message:3"),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]})
    );
    assert_eq!(
        item("call:w1"),
        json!({"type": "function_call", "call_id": "w1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
    );
    assert_eq!(
        item("output:w1"),
        json!({"type": "function_call_output", "call_id": "w1", "output": "{\"temp\":21}"})
    );
    assert_eq!(
        item("output:t1"),
        json!({"type": "function_call_output", "call_id": "t1", "output": "{\"rang\": true}"})
    );
    let partial = item("partial:t1:1");
    assert_eq!(partial["role"], "system");
    let text = partial["content"][0]["text"].as_str().expect("text");
    assert!(
        text.contains("t1") && text.contains("{\"remaining\": 30}"),
        "{text}"
    );
    assert_eq!(
        openai_realtime::tools(&ctx.tools)[0],
        json!({"type": "function", "name": "get_weather", "description": "Current weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
    );
}

#[test]
fn a_pending_sync_result_is_not_sent_to_realtime_and_results_lead_anthropic_user_turns() {
    let messages = vec![
        Message::user("what time is it"),
        call("c1", "get_time", json!({})),
        Message::tool("c1", "IN_PROGRESS"),
        Message::user("and the date?"),
    ];
    let keys: Vec<String> = openai_realtime::items(&messages)
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(keys, ["message:0", "call:c1", "message:3"]);
    // The user spoke after the placeholder: the result block still comes first in that turn.
    let body = anthropic::messages(&messages);
    assert_eq!(body[2]["content"][0]["type"], "tool_result");
    assert_eq!(body[2]["content"][1]["text"], "and the date?");
    assert_eq!(body.len(), 3);
}

#[test]
fn tool_choice_maps_per_provider() {
    let choice = ToolChoice::Function("get_weather".into());
    assert_eq!(
        openai::tool_choice(&choice),
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(
        anthropic::tool_choice(&ToolChoice::Required),
        json!({"type": "any"})
    );
    assert_eq!(
        openai_realtime::tool_choice(&choice),
        json!({"type": "function", "name": "get_weather"})
    );
    let ctx = LlmContext {
        tool_choice: Some(choice),
        ..conversation()
    };
    let body = gemini::request(&ctx.messages, &ctx.tools, ctx.tool_choice.as_ref())
        .expect("a valid request");
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}})
    );
    // A function without arguments has no parameters for Gemini.
    assert_eq!(
        gemini::declaration(&FunctionSchema::new("now", "The time.")),
        json!({"name": "now", "description": "The time."})
    );
}

#[test]
fn calls_of_one_reply_are_grouped_and_calls_of_later_replies_are_not() {
    use voxide::context::{AssistantMeta, StopReason};
    let end_of_reply = || {
        Some(Box::new(AssistantMeta {
            blocks: Vec::new(),
            provider: "anthropic".into(),
            model: "m".into(),
            usage: Default::default(),
            cost_usd: None,
            stop_reason: StopReason::ToolUse,
            timestamp: std::time::SystemTime::UNIX_EPOCH,
        }))
    };
    // The first call ended its reply; the second came in the reply after its result.
    let mut first = call("a", "get_current_time", json!({}));
    if let Message::Assistant(m) = &mut first {
        m.meta = end_of_reply();
    }
    let mut second = call("b", "calculate", json!({"expression": "1+1"}));
    if let Message::Assistant(m) = &mut second {
        m.meta = end_of_reply();
    }
    let sequential = vec![
        Message::user("time, then add"),
        first,
        Message::tool("a", "noon"),
        second,
        Message::tool("b", "2"),
    ];
    let roles = |body: Value| -> Vec<String> {
        body.as_array()
            .expect("turns")
            .iter()
            .map(|m| m["role"].as_str().expect("role").to_owned())
            .collect()
    };
    assert_eq!(
        roles(json!(anthropic::messages(&sequential))),
        ["user", "assistant", "user", "assistant", "user"]
    );
    assert_eq!(
        roles(json!(gemini::contents(&sequential))),
        ["user", "model", "user", "model", "user"]
    );
}

#[test]
fn a_context_ending_on_the_bot_is_an_error_for_anthropic_and_gemini_not_a_prefill() {
    use voxide::context::adapters::ContextError;
    let tools = ToolsSchema::default();
    let messages = vec![
        Message::system("Be brief."),
        Message::user("Hi"),
        Message::assistant("Hello."),
    ];
    assert_eq!(
        anthropic::request(&messages, &tools, None),
        Err(ContextError::EndsOnAssistant {
            provider: "Anthropic"
        })
    );
    assert_eq!(
        gemini::request(&messages, &tools, None),
        Err(ContextError::EndsOnAssistant { provider: "Gemini" })
    );
    // OpenAI continues the bot's words: valid there.
    assert!(openai::request(&messages, &tools, None).is_ok());
}

#[test]
fn instructions_alone_are_the_turn_a_bot_that_speaks_first_answers() {
    let tools = ToolsSchema::default();
    let messages = vec![
        Message::system("You are a receptionist."),
        Message::system("Greet the caller."),
    ];
    let body = anthropic::request(&messages, &tools, None).expect("valid");
    assert_eq!(body["system"], "You are a receptionist.");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Greet the caller."}]}])
    );
    let body = gemini::request(&messages[1..], &tools, None).expect("valid");
    assert!(body.get("systemInstruction").is_none());
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "Greet the caller."}]}])
    );
}

#[test]
fn a_result_without_its_call_or_a_call_without_its_result_is_an_error_before_anything_is_sent() {
    use voxide::context::adapters::ContextError;
    let tools = ToolsSchema::default();
    let orphan = vec![Message::user("Hi"), Message::tool("a", "1")];
    let unanswered = vec![
        Message::user("Hi"),
        call("a", "get_current_time", json!({})),
        Message::user("Well?"),
    ];
    for (messages, error) in [
        (&orphan, ContextError::ResultWithoutCall { id: "a".into() }),
        (
            &unanswered,
            ContextError::CallWithoutResult { id: "a".into() },
        ),
    ] {
        assert_eq!(openai::request(messages, &tools, None), Err(error.clone()));
        assert_eq!(
            anthropic::request(messages, &tools, None),
            Err(error.clone())
        );
        assert_eq!(gemini::request(messages, &tools, None), Err(error));
    }
}

#[test]
fn anthropic_thinking_goes_back_verbatim_before_the_words_and_calls_it_led_to() {
    use voxide::context::AssistantMessage;
    let thinking = json!({"type": "thinking", "thinking": "Need the clock.", "signature": "EqQB"});
    let messages = vec![
        Message::user("What time is it?"),
        Message::Assistant(AssistantMessage {
            content: Some(Some(voxide::context::Content::Text("Let me check.".into()))),
            tool_calls: Some(vec![ToolCall::function(
                "a",
                "get_current_time",
                &json!({}),
            )]),
            ..AssistantMessage::default()
        }),
        Message::tool("a", "noon"),
        Message::ProviderSpecific(anthropic::thinking_message("a", vec![thinking.clone()])),
    ];
    let body = anthropic::request(&messages, &ToolsSchema::default(), None).expect("valid");
    assert_eq!(
        body["messages"][1]["content"],
        json!([
            thinking,
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "a", "name": "get_current_time", "input": {}}
        ])
    );
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(3));
    // Other providers never see it.
    let body = openai::request(&messages, &ToolsSchema::default(), None).expect("valid");
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(3));
}
