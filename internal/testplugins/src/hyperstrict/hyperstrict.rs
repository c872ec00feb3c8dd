// hyperstrict is a v2 test plugin that accepts only the messages hyper-mcp
// sends its plugins (hyper-mcp src/plugin.rs) and traps on anything else,
// so that a test which talks to it through wasmtools proves the host sends
// exactly those messages. It is written in Rust with the standard library
// only and imports the Extism kernel by hand, so that it depends on nothing
// of wasmtools (not abi/guest, not an Extism PDK) that could share a
// mistake with the host. Build (scripts/build-plugins.sh does):
//
//   /usr/bin/rustc --target wasm32-wasi --crate-type cdylib -O -C strip=debuginfo hyperstrict.rs -o hyperstrict.wasm
//
// The messages it accepts, C being {"id": number or string, "_meta": {...}}
// plus, as wasmtools' own, "session_id" and "protocol_version" (strings)
// and, in list inputs only, "cursor" (a string):
//
//   list_tools, list_prompts, list_resources, list_resource_templates: {"context": C}
//   call_tool, get_prompt, read_resource, complete: {"request": <MCP params>, "context": C}
//   complete: request.ref.type is "prompt" or "resource", without "ref/"
//   on_roots_list_changed: {"context": {"_meta": {...}}}
//
// A message of another shape panics: Rust prints the reason on stderr,
// which the host logs, and the panic ends in a Wasm trap.

use std::sync::atomic::{AtomicU64, Ordering};

#[link(wasm_import_module = "extism:host/env")]
extern "C" {
    fn input_length() -> u64;
    fn input_load_u8(offs: u64) -> u32;
    fn input_load_u64(offs: u64) -> u64;
    fn alloc(n: u64) -> u64;
    fn store_u8(offs: u64, v: u32);
    fn store_u64(offs: u64, v: u64);
    fn output_set(offs: u64, n: u64);
    fn error_set(offs: u64);
}

// How many times on_roots_list_changed ran on this instance: the tool
// roots_changed reports it, so a test sees the notification arrive. rustc
// links a cdylib for wasm32-wasi as a WASI command, whose every export
// runs the C constructors first (the ".command_export" wrappers); a static
// with a constant initialiser lives in the data section, which they do not
// touch, so the count survives from call to call.
static ROOTS_CHANGED: AtomicU64 = AtomicU64::new(0);

// ---- JSON ----

// Json keeps numbers as their text and objects in their order, with
// duplicate keys refused, so that echo_context shows what the host sent.
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Num(_) => "a number",
            Json::Str(_) => "a string",
            Json::Arr(_) => "an array",
            Json::Obj(_) => "an object",
        }
    }

    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(n),
            Json::Str(s) => quote(s, out),
            Json::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Obj(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    quote(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }

    fn to_string(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }
}

fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn q(s: &str) -> String {
    let mut out = String::new();
    quote(s, &mut out);
    out
}

// Parser is RFC 8259 JSON, strictly: no trailing commas, no leading zeros,
// no lone surrogates, no control characters in strings, nothing after the
// value. Its errors panic: a host that sends bad JSON is as wrong as one
// that sends the wrong shape.
struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn fail(&self, why: &str) -> ! {
        panic!("hyperstrict: input is not valid JSON: {} at byte {}", why, self.i)
    }

    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) {
        if self.peek() != Some(c) {
            self.fail(&format!("want '{}'", c as char));
        }
        self.i += 1;
    }

    fn literal(&mut self, word: &str, v: Json) -> Json {
        if !self.b[self.i..].starts_with(word.as_bytes()) {
            self.fail("unknown literal");
        }
        self.i += word.len();
        v
    }

    fn value(&mut self) -> Json {
        self.ws();
        match self.peek() {
            None => self.fail("unexpected end"),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Json::Str(self.string()),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            Some(b'-') | Some(b'0'..=b'9') => self.number(),
            Some(_) => self.fail("unexpected character"),
        }
    }

    fn nest(&mut self) {
        self.depth += 1;
        if self.depth > 64 {
            self.fail("nested more than 64 deep");
        }
    }

    fn object(&mut self) -> Json {
        self.nest();
        self.expect(b'{');
        let mut m: Vec<(String, Json)> = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            self.depth -= 1;
            return Json::Obj(m);
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                self.fail("want a key");
            }
            let k = self.string();
            if m.iter().any(|(have, _)| *have == k) {
                self.fail(&format!("duplicate key {}", q(&k)));
            }
            self.ws();
            self.expect(b':');
            let v = self.value();
            m.push((k, v));
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Json::Obj(m);
                }
                _ => self.fail("want ',' or '}'"),
            }
        }
    }

    fn array(&mut self) -> Json {
        self.nest();
        self.expect(b'[');
        let mut a = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            self.depth -= 1;
            return Json::Arr(a);
        }
        loop {
            a.push(self.value());
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Json::Arr(a);
                }
                _ => self.fail("want ',' or ']'"),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Json {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let lead = self.peek();
        let n = self.digits();
        if n == 0 || (n > 1 && lead == Some(b'0')) {
            self.fail("bad number");
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                self.fail("bad fraction");
            }
        }
        if matches!(self.peek(), Some(b'e') | Some(b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+') | Some(b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                self.fail("bad exponent");
            }
        }
        Json::Num(String::from_utf8(self.b[start..self.i].to_vec()).unwrap())
    }

    fn hex4(&mut self) -> u32 {
        if self.i + 4 > self.b.len() {
            self.fail("short \\u escape");
        }
        let s = std::str::from_utf8(&self.b[self.i..self.i + 4]).unwrap_or("x");
        let v = u32::from_str_radix(s, 16).unwrap_or_else(|_| self.fail("bad \\u escape"));
        self.i += 4;
        v
    }

    fn string(&mut self) -> String {
        self.expect(b'"');
        let mut out: Vec<u8> = Vec::new();
        loop {
            let c = match self.peek() {
                None => self.fail("unterminated string"),
                Some(c) => c,
            };
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = self.peek().unwrap_or_else(|| self.fail("unterminated escape"));
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4();
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                if !self.b[self.i..].starts_with(b"\\u") {
                                    self.fail("lone high surrogate");
                                }
                                self.i += 2;
                                let lo = self.hex4();
                                if !(0xDC00..0xE000).contains(&lo) {
                                    self.fail("bad low surrogate");
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            char::from_u32(cp).unwrap_or_else(|| self.fail("lone low surrogate"))
                        }
                        _ => self.fail("unknown escape"),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                c if c < 0x20 => self.fail("control character in a string"),
                c => out.push(c),
            }
        }
        String::from_utf8(out).unwrap_or_else(|_| self.fail("string is not UTF-8"))
    }
}

fn parse(b: &[u8]) -> Json {
    let mut p = Parser { b, i: 0, depth: 0 };
    let v = p.value();
    p.ws();
    if p.i != b.len() {
        p.fail("data after the value");
    }
    v
}

// ---- the Extism kernel ----

fn read_input() -> Vec<u8> {
    let n = unsafe { input_length() };
    let mut b = Vec::with_capacity(n as usize);
    let mut i = 0;
    while i + 8 <= n {
        b.extend_from_slice(&unsafe { input_load_u64(i) }.to_le_bytes());
        i += 8;
    }
    while i < n {
        b.push(unsafe { input_load_u8(i) } as u8);
        i += 1;
    }
    b
}

fn block(b: &[u8]) -> u64 {
    let off = unsafe { alloc(b.len() as u64) };
    let mut i = 0;
    while i + 8 <= b.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        unsafe { store_u64(off + i as u64, u64::from_le_bytes(w)) };
        i += 8;
    }
    while i < b.len() {
        unsafe { store_u8(off + i as u64, b[i] as u32) };
        i += 1;
    }
    off
}

fn output(s: &str) -> i32 {
    let off = block(s.as_bytes());
    unsafe { output_set(off, s.len() as u64) };
    0
}

// fail is a guest error (the export returns 1): for requests of the right
// shape that ask for something that does not exist.
fn fail(msg: &str) -> i32 {
    let off = block(msg.as_bytes());
    unsafe { error_set(off) };
    1
}

// ---- shapes ----

fn obj<'a>(v: &'a Json, what: &str) -> &'a Vec<(String, Json)> {
    match v {
        Json::Obj(m) => m,
        _ => panic!("hyperstrict: {} is {}, want an object", what, v.kind()),
    }
}

// keys checks that v is an object with every key of required and no key
// outside required and optional.
fn keys<'a>(v: &'a Json, what: &str, required: &[&str], optional: &[&str]) -> &'a Vec<(String, Json)> {
    let m = obj(v, what);
    for r in required {
        if !m.iter().any(|(k, _)| k == r) {
            panic!("hyperstrict: {} lacks {}: {}", what, q(r), v.to_string());
        }
    }
    for (k, _) in m {
        if !required.contains(&k.as_str()) && !optional.contains(&k.as_str()) {
            panic!("hyperstrict: {} has the key {}, which hyper-mcp never sends: {}", what, q(k), v.to_string());
        }
    }
    m
}

fn string<'a>(v: Option<&'a Json>, what: &str) -> Option<&'a str> {
    match v {
        None => None,
        Some(Json::Str(s)) => Some(s),
        Some(other) => panic!("hyperstrict: {} is {}, want a string", what, other.kind()),
    }
}

fn object_of_strings(v: Option<&Json>, what: &str) {
    if let Some(v) = v {
        for (k, s) in obj(v, what) {
            string(Some(s), &format!("{}.{}", what, k));
        }
    }
}

// context checks C and returns it.
fn context<'a>(input: &'a Json, what: &str, list: bool) -> &'a Json {
    let c = input.get("context").unwrap();
    let extra: &[&str] = if list { &["session_id", "protocol_version", "cursor"] } else { &["session_id", "protocol_version"] };
    keys(c, &format!("{}'s context", what), &["id", "_meta"], extra);
    match c.get("id").unwrap() {
        Json::Num(_) | Json::Str(_) => {}
        other => panic!("hyperstrict: {}'s context.id is {}, want a number or a string", what, other.kind()),
    }
    obj(c.get("_meta").unwrap(), &format!("{}'s context._meta", what));
    for k in ["session_id", "protocol_version", "cursor"] {
        string(c.get(k), &format!("{}'s context.{}", what, k));
    }
    c
}

fn list_input(what: &str) -> Json {
    let input = parse(&read_input());
    keys(&input, &format!("{}'s input", what), &["context"], &[]);
    context(&input, what, true);
    input
}

// request_input checks {"request": R, "context": C}, R having the keys
// required and, beside them, optional and _meta (an object).
fn request_input(what: &str, required: &[&str], optional: &[&str]) -> Json {
    let input = parse(&read_input());
    keys(&input, &format!("{}'s input", what), &["request", "context"], &[]);
    context(&input, what, false);
    let mut opt = optional.to_vec();
    opt.push("_meta");
    let r = input.get("request").unwrap();
    keys(r, &format!("{}'s request", what), required, &opt);
    if let Some(m) = r.get("_meta") {
        obj(m, &format!("{}'s request._meta", what));
    }
    input
}

// ---- exports ----

const NO_ARGS: &str = r#"{"type":"object","properties":{}}"#;

#[no_mangle]
pub extern "C" fn list_tools() -> i32 {
    list_input("list_tools");
    output(&format!(
        r#"{{"tools":[{{"name":"echo_context","description":"The context of this call, as JSON.","inputSchema":{a}}},{{"name":"roots_changed","description":"How many times this instance was told its client's roots changed.","inputSchema":{a}}}]}}"#,
        a = NO_ARGS
    ))
}

#[no_mangle]
pub extern "C" fn call_tool() -> i32 {
    let input = request_input("call_tool", &["name"], &["arguments"]);
    let r = input.get("request").unwrap();
    let name = string(r.get("name"), "call_tool's request.name").unwrap();
    // The tools take no arguments: the host must have removed its own
    // (the session argument of 2026-07-28) before the guest sees them.
    if let Some(a) = r.get("arguments") {
        keys(a, "call_tool's request.arguments", &[], &[]);
    }
    let text = match name {
        "echo_context" => input.get("context").unwrap().to_string(),
        "roots_changed" => ROOTS_CHANGED.load(Ordering::SeqCst).to_string(),
        other => panic!("hyperstrict: call_tool of {}, a tool it never listed", q(other)),
    };
    output(&format!(r#"{{"content":[{{"type":"text","text":{}}}]}}"#, q(&text)))
}

#[no_mangle]
pub extern "C" fn list_prompts() -> i32 {
    list_input("list_prompts");
    output(r#"{"prompts":[{"name":"strict_prompt","description":"One user message about a topic.","arguments":[{"name":"topic","description":"What to ask about.","required":true}]}]}"#)
}

#[no_mangle]
pub extern "C" fn get_prompt() -> i32 {
    let input = request_input("get_prompt", &["name"], &["arguments"]);
    let r = input.get("request").unwrap();
    let name = string(r.get("name"), "get_prompt's request.name").unwrap();
    object_of_strings(r.get("arguments"), "get_prompt's request.arguments");
    if name != "strict_prompt" {
        panic!("hyperstrict: get_prompt of {}, a prompt it never listed", q(name));
    }
    let topic = match r.get("arguments").and_then(|a| a.get("topic")) {
        Some(Json::Str(t)) => t,
        _ => return fail("strict_prompt: the argument topic is required"),
    };
    output(&format!(
        r#"{{"messages":[{{"role":"user","content":{{"type":"text","text":{}}}}}]}}"#,
        q(&format!("Tell me about {}.", topic))
    ))
}

#[no_mangle]
pub extern "C" fn list_resources() -> i32 {
    list_input("list_resources");
    output(r#"{"resources":[{"uri":"strict://context","name":"context","description":"The context of this read, as JSON.","mimeType":"application/json"}]}"#)
}

#[no_mangle]
pub extern "C" fn list_resource_templates() -> i32 {
    list_input("list_resource_templates");
    output(r#"{"resourceTemplates":[{"uriTemplate":"strict://item/{id}","name":"item","description":"An item, named by its id.","mimeType":"text/plain"}]}"#)
}

#[no_mangle]
pub extern "C" fn read_resource() -> i32 {
    let input = request_input("read_resource", &["uri"], &[]);
    let uri = string(input.get("request").unwrap().get("uri"), "read_resource's request.uri").unwrap();
    let (mime, text) = if uri == "strict://context" {
        ("application/json", input.get("context").unwrap().to_string())
    } else if let Some(id) = uri.strip_prefix("strict://item/") {
        ("text/plain", format!("item {}", id))
    } else {
        return fail(&format!("no resource {}", uri));
    };
    output(&format!(r#"{{"contents":[{{"uri":{},"mimeType":{},"text":{}}}]}}"#, q(uri), q(mime), q(&text)))
}

#[no_mangle]
pub extern "C" fn complete() -> i32 {
    let input = request_input("complete", &["ref", "argument"], &["context"]);
    let r = input.get("request").unwrap();
    let rf = r.get("ref").unwrap();
    // hyper-mcp's plugins get the reference's type without "ref/".
    let kind = match rf.get("type") {
        Some(Json::Str(t)) if t == "prompt" || t == "resource" => t.as_str(),
        Some(Json::Str(t)) => panic!("hyperstrict: complete's request.ref.type is {}, want \"prompt\" or \"resource\"", q(t)),
        _ => panic!("hyperstrict: complete's request.ref.type is missing or not a string: {}", rf.to_string()),
    };
    let id_key = if kind == "prompt" { "name" } else { "uri" };
    keys(rf, "complete's request.ref", &["type", id_key], &[]);
    let target = string(rf.get(id_key), "complete's request.ref's name or uri").unwrap();
    let arg = r.get("argument").unwrap();
    keys(arg, "complete's request.argument", &["name", "value"], &[]);
    let arg_name = string(arg.get("name"), "complete's request.argument.name").unwrap();
    let value = string(arg.get("value"), "complete's request.argument.value").unwrap();
    if let Some(c) = r.get("context") {
        keys(c, "complete's request.context", &[], &["arguments"]);
        object_of_strings(c.get("arguments"), "complete's request.context.arguments");
    }
    let mut values = Vec::new();
    if kind == "prompt" && target == "strict_prompt" && arg_name == "topic" {
        for v in ["alpha", "beta"] {
            if v.starts_with(value) {
                values.push(q(v));
            }
        }
    }
    output(&format!(r#"{{"completion":{{"values":[{}]}}}}"#, values.join(",")))
}

#[no_mangle]
pub extern "C" fn on_roots_list_changed() -> i32 {
    let input = parse(&read_input());
    keys(&input, "on_roots_list_changed's input", &["context"], &[]);
    let c = input.get("context").unwrap();
    keys(c, "on_roots_list_changed's context", &["_meta"], &[]);
    obj(c.get("_meta").unwrap(), "on_roots_list_changed's context._meta");
    ROOTS_CHANGED.fetch_add(1, Ordering::SeqCst);
    0
}
