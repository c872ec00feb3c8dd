//go:build wasip1

// Command everything is the fixture server of the MCP conformance suite
// (npm @modelcontextprotocol/conformance) as a plugin: its tools, prompts,
// resources, resource template and completion, mirroring the go-sdk's own
// conformance server. `wasmtools serve --http ADDR everything.wasm` is the
// server under test (scripts/conformance.sh).
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o everything.wasm .
package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/abi/guest"
)

func main() {}

// The suite's minimal test files: a 1x1 red PNG and a silent WAV.
const (
	imageBase64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
	audioBase64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
)

// block is one MCP content block as JSON.
func block(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func text(s string) json.RawMessage { return block(guest.TextBlock(s)) }

func image() json.RawMessage {
	return block(map[string]any{"type": "image", "data": imageBase64, "mimeType": "image/png"})
}

func embedded(uri, s string) json.RawMessage {
	return block(map[string]any{"type": "resource", "resource": map[string]any{"uri": uri, "mimeType": "text/plain", "text": s}})
}

func content(blocks ...json.RawMessage) *guest.Result { return &guest.Result{Content: blocks} }

func tool(name, description, schema string, h guest.Handler) guest.Tool {
	return guest.Tool{Name: name, Description: description, InputSchema: schema, Handler: h}
}

func init() {
	guest.Register(
		tool("test_simple_text", "Tests simple text content response", "", func(*guest.Call) (*guest.Result, error) {
			return content(text("This is a simple text response for testing.")), nil
		}),
		tool("test_image_content", "Tests image content response", "", func(*guest.Call) (*guest.Result, error) {
			return content(image()), nil
		}),
		tool("test_audio_content", "Tests audio content response", "", func(*guest.Call) (*guest.Result, error) {
			return content(block(map[string]any{"type": "audio", "data": audioBase64, "mimeType": "audio/wav"})), nil
		}),
		tool("test_embedded_resource", "Tests embedded resource content response", "", func(*guest.Call) (*guest.Result, error) {
			return content(embedded("test://embedded-resource", "This is an embedded resource")), nil
		}),
		tool("test_multiple_content_types", "Tests response with multiple content types (text, image, resource)", "", func(*guest.Call) (*guest.Result, error) {
			return content(text("This is text content"), image(), embedded("test://embedded-in-multiple", "This is an embedded resource")), nil
		}),
		tool("test_tool_with_logging", "Tests tool that emits log messages during execution", "", func(*guest.Call) (*guest.Result, error) {
			guest.Log("info", "Tool execution started")
			guest.Log("info", "Tool processing data")
			guest.Log("info", "Tool execution completed")
			return content(text("Tool with logging executed successfully")), nil
		}),
		tool("test_tool_with_progress", "Tests tool that reports progress notifications", "", testProgress),
		tool("test_error_handling", "Tests error response handling", "", func(*guest.Call) (*guest.Result, error) {
			return nil, errors.New("this tool intentionally returns an error for testing")
		}),
		tool("test_sampling", "Tests server-initiated sampling (LLM completion request)",
			`{"type":"object","properties":{"prompt":{"type":"string","description":"The prompt to send to the LLM"}},"required":["prompt"]}`, testSampling),
		tool("test_elicitation", "Tests server-initiated elicitation (user input request)",
			`{"type":"object","properties":{"message":{"type":"string","description":"The message to show the user"}},"required":["message"]}`,
			func(c *guest.Call) (*guest.Result, error) {
				var in struct{ Message string }
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				return elicit(in.Message, `{"type":"object","properties":{"username":{"type":"string","description":"Your preferred username"}},"required":["username"]}`)
			}),
		tool("test_elicitation_sep1034_defaults", "Tests elicitation with default values per SEP-1034", "", func(*guest.Call) (*guest.Result, error) {
			return elicit("Test defaults for primitives", `{"type":"object","properties":{
				"name":{"type":"string","description":"User name","default":"John Doe"},
				"age":{"type":"integer","description":"User age","default":30},
				"score":{"type":"number","description":"User score","default":95.5},
				"status":{"type":"string","description":"User status","enum":["active","inactive","pending"],"default":"active"},
				"verified":{"type":"boolean","description":"Verification status","default":true}}}`)
		}),
		tool("test_elicitation_sep1330_enums", "Tests elicitation with enum schema improvements per SEP-1330", "", func(*guest.Call) (*guest.Result, error) {
			return elicit("Test enum schemas", `{"type":"object","properties":{
				"untitledSingle":{"type":"string","enum":["option1","option2","option3"]},
				"titledSingle":{"type":"string","oneOf":[{"const":"value1","title":"First Option"},{"const":"value2","title":"Second Option"},{"const":"value3","title":"Third Option"}]},
				"legacyEnum":{"type":"string","enum":["opt1","opt2","opt3"],"enumNames":["Option One","Option Two","Option Three"]},
				"untitledMulti":{"type":"array","minItems":1,"maxItems":3,"items":{"type":"string","enum":["option1","option2","option3"]}},
				"titledMulti":{"type":"array","minItems":1,"maxItems":3,"items":{"type":"string","anyOf":[{"const":"value1","title":"First Option"},{"const":"value2","title":"Second Option"},{"const":"value3","title":"Third Option"}]}}}}`)
		}),
		tool("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613, SEP-2106)", jsonSchema202012,
			func(c *guest.Call) (*guest.Result, error) {
				return content(text(fmt.Sprintf("JSON Schema 2020-12 tool called with: %s", c.Arguments))), nil
			}),
	)

	guest.RegisterPrompt(
		// A prompt that asks the user first (SEP-2322: an input-required
		// result for prompts/get; elicitation/create before 2026-07-28).
		guest.Prompt{
			Name: "test_input_required_result_prompt", Title: "Prompt That Asks", Description: "Asks the user for context, then builds the prompt",
			Get: func(map[string]string) (*guest.PromptResult, error) {
				a, err := guest.Elicit(abi.ElicitRequest{ElicitationID: "user_context", Message: "What context should the prompt use?",
					RequestedSchema: json.RawMessage(`{"type":"object","properties":{"context":{"type":"string"}},"required":["context"]}`)})
				if err != nil {
					return nil, err
				}
				return &guest.PromptResult{Description: "A prompt built from the user's answer", Messages: []guest.PromptMessage{
					{Role: "user", Content: guest.TextBlock(fmt.Sprintf("Context (%s): %v", a.Action, a.Content["context"]))},
				}}, nil
			},
		},
		guest.Prompt{
			Name: "test_simple_prompt", Title: "Simple Test Prompt", Description: "A simple prompt without arguments",
			Get: func(map[string]string) (*guest.PromptResult, error) {
				return &guest.PromptResult{Description: "A simple test prompt", Messages: []guest.PromptMessage{
					{Role: "user", Content: guest.TextBlock("This is a simple prompt for testing.")},
				}}, nil
			},
		},
		guest.Prompt{
			Name: "test_prompt_with_arguments", Title: "Prompt With Arguments", Description: "A prompt with required arguments",
			Arguments: []guest.PromptArgument{
				{Name: "arg1", Description: "First test argument", Required: true},
				{Name: "arg2", Description: "Second test argument", Required: true},
			},
			Get: func(args map[string]string) (*guest.PromptResult, error) {
				return &guest.PromptResult{Description: "A prompt with arguments", Messages: []guest.PromptMessage{
					{Role: "user", Content: guest.TextBlock(fmt.Sprintf("Prompt with arguments: arg1='%s', arg2='%s'", args["arg1"], args["arg2"]))},
				}}, nil
			},
		},
		guest.Prompt{
			Name: "test_prompt_with_embedded_resource", Title: "Prompt With Embedded Resource", Description: "A prompt that includes an embedded resource",
			Arguments: []guest.PromptArgument{{Name: "resourceUri", Description: "URI of the resource to embed", Required: true}},
			Get: func(args map[string]string) (*guest.PromptResult, error) {
				return &guest.PromptResult{Description: "A prompt with an embedded resource", Messages: []guest.PromptMessage{
					{Role: "user", Content: embedded(args["resourceUri"], "Embedded resource content for testing.")},
					{Role: "user", Content: guest.TextBlock("Please process the embedded resource above.")},
				}}, nil
			},
		},
		guest.Prompt{
			Name: "test_prompt_with_image", Title: "Prompt With Image", Description: "A prompt that includes image content",
			Get: func(map[string]string) (*guest.PromptResult, error) {
				return &guest.PromptResult{Description: "A prompt with an image", Messages: []guest.PromptMessage{
					{Role: "user", Content: image()},
					{Role: "user", Content: guest.TextBlock("Please analyze the image above.")},
				}}, nil
			},
		},
	)

	png, _ := base64.StdEncoding.DecodeString(imageBase64)
	guest.RegisterResource(
		guest.Resource{
			URI: "test://static-text", Name: "static-text", Description: "A static text resource for testing", MIMEType: "text/plain",
			Read: func(uri string, _ map[string]string) ([]guest.ResourceContents, error) {
				return []guest.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: "This is the content of the static text resource."}}, nil
			},
		},
		guest.Resource{
			URI: "test://static-binary", Name: "static-binary", Description: "A static binary resource (image) for testing", MIMEType: "image/png",
			Read: func(uri string, _ map[string]string) ([]guest.ResourceContents, error) {
				return []guest.ResourceContents{{URI: uri, MIMEType: "image/png", Blob: png}}, nil
			},
		},
		guest.Resource{
			URITemplate: "test://template/{id}/data", Name: "template", Description: "A resource template with parameter substitution", MIMEType: "application/json",
			Read: func(uri string, vars map[string]string) ([]guest.ResourceContents, error) {
				id := vars["id"]
				return []guest.ResourceContents{{URI: uri, MIMEType: "application/json",
					Text: fmt.Sprintf(`{"id": "%s", "templateTest": true, "data": "Data for ID: %s"}`, id, id)}}, nil
			},
			Complete: func(string, string, map[string]string) []string { return []string{} },
		},
		guest.Resource{
			URI: "test://watched-resource", Name: "watched-resource", Description: "A resource that changes when the tool test_update_watched_resource runs", MIMEType: "text/plain",
			Read: func(uri string, _ map[string]string) ([]guest.ResourceContents, error) {
				return []guest.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: "Watched resource content"}}, nil
			},
		},
	)
	registerInputRequired()
	registerTriggers()
	registerTasks()
	guest.Register(tool("test_update_watched_resource", "Tells subscribers that test://watched-resource changed", "", func(*guest.Call) (*guest.Result, error) {
		guest.NotifyResourceUpdated("test://watched-resource")
		return content(text("updated test://watched-resource")), nil
	}))
}

func testProgress(c *guest.Call) (*guest.Result, error) {
	for _, p := range []float64{0, 50, 100} {
		guest.Progress(p, 100, fmt.Sprintf("Completed step %.0f of %.0f", p, 100.0))
	}
	var meta struct {
		ProgressToken any `json:"progressToken"`
	}
	if len(c.Meta) > 0 {
		_ = json.Unmarshal(c.Meta, &meta)
	}
	return content(text(fmt.Sprintf("%v", meta.ProgressToken))), nil
}

func testSampling(c *guest.Call) (*guest.Result, error) {
	var in struct{ Prompt string }
	if err := c.Bind(&in); err != nil {
		return nil, err
	}
	res, err := guest.CreateMessage(map[string]any{
		"messages":  []guest.PromptMessage{{Role: "user", Content: guest.TextBlock(in.Prompt)}},
		"maxTokens": 100,
	})
	if err != nil {
		return nil, fmt.Errorf("sampling failed: %w", err)
	}
	reply := "(non-text response)"
	var tc abi.TextContent
	if json.Unmarshal(res.Content, &tc) == nil && tc.Type == "text" {
		reply = tc.Text
	}
	return content(text("LLM response: " + reply)), nil
}

func elicit(message, schema string) (*guest.Result, error) {
	res, err := guest.Elicit(abi.ElicitRequest{Message: message, RequestedSchema: json.RawMessage(schema)})
	if err != nil {
		return nil, fmt.Errorf("elicitation failed: %w", err)
	}
	return content(text(fmt.Sprintf("Elicitation result: action=%s, content=%v", res.Action, res.Content))), nil
}

// The fixtures of the suite's 2026-07-28 line (SEP-2322, input-required
// results). The host asks a 2026-07-28 client each question through an
// input-required result under the key the question's elicitationId names,
// one question a round, and resumes the guest with the answer; a client
// before 2026-07-28 is asked with elicitation/create or
// sampling/createMessage as the call runs. Several questions at once go
// in one round through guest.RequestInputs.
func registerInputRequired() {
	const noArgs = ""
	guest.Register(
		tool("test_input_required_result_elicitation", "Asks the user's name through an input-required result (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				a, err := ask("user_name", "What is your name?", `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)
				if err != nil {
					return nil, err
				}
				return content(text(fmt.Sprintf("Hello, %v!", a.Content["name"]))), nil
			}),
		tool("test_input_required_result_sampling", "Asks the client's model through an input-required result (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				reply, err := sample("What is the capital of France?", 100)
				if err != nil {
					return nil, err
				}
				return content(text("LLM response: " + reply)), nil
			}),
		tool("test_input_required_result_request_state", "Asks for a confirmation; the retry's requestState is checked (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				a, err := ask("confirm", "Please confirm", `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`)
				if err != nil {
					return nil, err
				}
				// The host resumed this call only for a retry whose
				// requestState verified.
				return content(text(fmt.Sprintf("state-ok: action=%s, ok=%v", a.Action, a.Content["ok"]))), nil
			}),
		tool("test_input_required_result_multi_round", "Asks two questions, one round each (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				name, err := ask("step1", "Step 1: What is your name?", `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)
				if err != nil {
					return nil, err
				}
				color, err := ask("step2", "Step 2: What is your favorite color?", `{"type":"object","properties":{"color":{"type":"string"}},"required":["color"]}`)
				if err != nil {
					return nil, err
				}
				return content(text(fmt.Sprintf("Hello, %v! Your favorite color is %v.", name.Content["name"], color.Content["color"]))), nil
			}),
		tool("test_input_required_result_tampered_state", "Asks for a confirmation under an HMAC-signed requestState (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				a, err := ask("confirm", "Please confirm", `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`)
				if err != nil {
					return nil, err
				}
				return content(text(fmt.Sprintf("confirmed: action=%s", a.Action))), nil
			}),
		tool("test_input_required_result_list_roots", "Asks for the client's roots through an input-required result (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				res, err := guest.RequestInputs(map[string]abi.InputRequest{"client_roots": {Method: "roots/list"}})
				if err != nil {
					return nil, err
				}
				if why, refused := res.Errors["client_roots"]; refused {
					return nil, fmt.Errorf("roots: %s", why)
				}
				var roots struct {
					Roots []guest.Root `json:"roots"`
				}
				json.Unmarshal(res.InputResponses["client_roots"], &roots)
				var uris []string
				for _, r := range roots.Roots {
					uris = append(uris, r.URI)
				}
				return content(text(fmt.Sprintf("Client roots: %v", uris))), nil
			}),
		tool("test_input_required_result_multiple_inputs", "Asks a question, the client's model and its roots in one round (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				res, err := guest.RequestInputs(map[string]abi.InputRequest{
					"user_name": {Method: "elicitation/create", Params: abi.ElicitRequest{Message: "What is your name?",
						RequestedSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)}},
					"greeting": {Method: "sampling/createMessage", Params: map[string]any{
						"messages": []any{map[string]any{"role": "user", "content": map[string]any{"type": "text", "text": "Generate a greeting"}}}, "maxTokens": 50}},
					"client_roots": {Method: "roots/list", Params: map[string]any{}},
				})
				if err != nil {
					return nil, err
				}
				answered := slices.Sorted(maps.Keys(res.InputResponses))
				return content(text(fmt.Sprintf("Received %d answers (%s); refused: %v", len(answered), strings.Join(answered, ", "), res.Errors))), nil
			}),
		tool("test_input_required_result_capabilities", "Asks only what the client offers: elicitation, else sampling (SEP-2322)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				// The host refuses a question the client cannot be
				// asked (it did not declare elicitation): fall back to
				// sampling.
				if a, err := ask("user_name", "What is your name?", `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`); err == nil {
					return content(text(fmt.Sprintf("Hello, %v!", a.Content["name"]))), nil
				}
				reply, err := sample("Generate a greeting", 50)
				if err != nil {
					return nil, err
				}
				return content(text("LLM response: " + reply)), nil
			}),
		// The diagnostic tools of the server-stateless scenario (SEP-2575)
		// and the x-mcp-header tool of http-custom-header-server-validation
		// (SEP-2243), as the go-sdk's conformance server has them.
		tool("test_streaming_elicitation", "Returns its result alone on the response stream: no independent JSON-RPC requests (SEP-2575)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				return content(text("stream observed: result frames only, no top-level requests")), nil
			}),
		tool("test_logging_tool", "Attempts to log; the host drops it when the client did not set _meta.../logLevel (SEP-2575)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				guest.Log("info", "test_logging_tool executed")
				return content(text("Log attempted; the host gates on _meta.../logLevel.")), nil
			}),
		tool("test_reconnection", "Closes the call's SSE stream before its result, with a retry field; the client reconnects with Last-Event-ID and gets the result (SEP-1699)", noArgs,
			func(*guest.Call) (*guest.Result, error) {
				guest.CloseStream(100)
				return content(text("Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.")), nil
			}),
		guest.Tool{
			Name:        "test_missing_capability",
			Description: "Requires the sampling client capability: the host refuses a call from a client without it with MissingRequiredClientCapability (-32021) (SEP-2575)",
			// The host checks this before the handler runs.
			RequiredClientCapabilities: `{"sampling":{}}`,
			Handler: func(*guest.Call) (*guest.Result, error) {
				return content(text("Client declared the sampling capability; tool executed.")), nil
			},
		},
		tool("test_x_mcp_header", "Tests SEP-2243 Mcp-Param-* server-side validation",
			`{"type":"object","properties":{
				"region":{"type":"string","description":"mirrored into Mcp-Param-Region","x-mcp-header":"Region"},
				"level":{"type":"integer","description":"non-mirrored argument"}}}`,
			func(c *guest.Call) (*guest.Result, error) {
				var in struct{ Region string }
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				return content(text("region=" + in.Region)), nil
			}),
	)
}

// changes counts this instance's list changes, so that each trigger
// changes the lists.
var changes int

// registerTriggers adds the hooks of the server-stateless scenario
// (SEP-2575) that change the tool or prompt list, as the go-sdk's
// conformance server has them. Each adds a tool or prompt to this
// instance's lists and tells the host, which reads the lists again from
// this instance once the call ends and sends list_changed (to a 2026-07-28
// client's subscriptions/listen stream). The addition is named after the
// change and described after the client (a 2026-07-28 client without a
// session handle gets a fresh instance for each call), so that every
// trigger changes what is served: the host tells clients only of real
// changes.
func registerTriggers() {
	guest.Register(
		tool("test_trigger_tool_change", "Adds a tool to the tool list, so that clients are sent tools/list_changed (SEP-2575)", "",
			func(c *guest.Call) (*guest.Result, error) {
				changes++
				name := fmt.Sprintf("test_dynamic_tool_%d", changes)
				guest.Register(tool(name, fmt.Sprintf("Added by test_trigger_tool_change (client %q)", c.Context.SessionID), "",
					func(*guest.Call) (*guest.Result, error) { return content(text("dynamic tool")), nil }))
				guest.ToolListChanged()
				return content(text("added tool " + name)), nil
			}),
		tool("test_trigger_prompt_change", "Adds a prompt to the prompt list, so that clients are sent prompts/list_changed (SEP-2575)", "",
			func(c *guest.Call) (*guest.Result, error) {
				changes++
				name := fmt.Sprintf("test_dynamic_prompt_%d", changes)
				guest.RegisterPrompt(guest.Prompt{Name: name, Description: fmt.Sprintf("Added by test_trigger_prompt_change (client %q)", c.Context.SessionID),
					Get: func(map[string]string) (*guest.PromptResult, error) {
						return &guest.PromptResult{Messages: []guest.PromptMessage{{Role: "user", Content: guest.TextBlock("dynamic prompt")}}}, nil
					}})
				guest.PromptListChanged()
				return content(text("added prompt " + name)), nil
			}),
	)
}

// registerTasks adds the fixtures of the Tasks extension's scenarios
// (SEP-2663): greet runs as a plain call; slow_compute, failing_job,
// protocol_error_job, confirm_delete and multi_input may run as tasks
// (failing_job must: the host refuses it, -32021, to a client that did
// not declare the extension). protocol_error_job panics: its task fails
// with a JSON-RPC error, where failing_job's completes with an error
// result. test_tool_with_task asks through an input-required result
// first and becomes a task on the retry that answers (TaskAfterInput).
func registerTasks() {
	guest.Register(
		tool("greet", "Says hello; never a task", `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`,
			func(c *guest.Call) (*guest.Result, error) {
				var in struct{ Name string }
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				return content(text(fmt.Sprintf("Hello, %s!", in.Name))), nil
			}),
		guest.Tool{
			Name:        "slow_compute",
			Description: "Computes for about the given seconds (a guest has no clock: work calibrated loosely), then returns; may run as a task",
			InputSchema: `{"type":"object","properties":{"seconds":{"type":"number","minimum":0,"maximum":600},"label":{"type":"string"}}}`,
			TaskSupport: abi.TaskOptional,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				var in struct {
					Seconds float64
					Label   string
				}
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				compute(in.Seconds)
				return content(text(fmt.Sprintf("computed %q for about %gs", in.Label, in.Seconds))), nil
			},
		},
		guest.Tool{
			Name:        "failing_job",
			Description: "Fails with a tool error after a moment; must run as a task",
			TaskSupport: abi.TaskRequired,
			Handler: func(*guest.Call) (*guest.Result, error) {
				compute(0.2)
				return nil, errors.New("failing_job failed, as it always does")
			},
		},
		guest.Tool{
			Name:           "test_tool_with_task",
			Description:    "Asks the user's name in a first round, then runs as a task",
			InputSchema:    `{"type":"object"}`,
			TaskSupport:    abi.TaskRequired,
			TaskAfterInput: true,
			Handler: func(*guest.Call) (*guest.Result, error) {
				a, err := ask("user_name", "What is your name?", `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)
				if err != nil {
					return nil, err
				}
				compute(0.1)
				return content(text(fmt.Sprintf("Hello, %v, from a task!", a.Content["name"]))), nil
			},
		},
		guest.Tool{
			Name:        "protocol_error_job",
			Description: "Panics (the guest crashes); may run as a task, which then fails with a protocol error",
			TaskSupport: abi.TaskOptional,
			Handler: func(*guest.Call) (*guest.Result, error) {
				panic("protocol_error_job crashes, as it always does")
			},
		},
		guest.Tool{
			Name:        "multi_input",
			Description: "Asks two questions at once (one round); may run as a task, which waits in input_required until both are answered",
			InputSchema: `{"type":"object"}`,
			TaskSupport: abi.TaskOptional,
			Handler: func(*guest.Call) (*guest.Result, error) {
				form := func(msg string) abi.InputRequest {
					return abi.InputRequest{Method: "elicitation/create", Params: abi.ElicitRequest{Message: msg,
						RequestedSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"confirm":{"type":"boolean"}}}`)}}
				}
				res, err := guest.RequestInputs(map[string]abi.InputRequest{"first": form("First question?"), "second": form("Second question?")})
				if err != nil {
					return nil, err
				}
				var names []string
				for _, k := range []string{"first", "second"} {
					var a abi.ElicitResult
					json.Unmarshal(res.InputResponses[k], &a)
					if why, refused := res.Errors[k]; refused {
						a.Error = why
					}
					if a.Error != "" || a.Action != abi.ActionAccept {
						names = append(names, fmt.Sprintf("%s=%s(%s)", k, a.Action, a.Error))
						continue
					}
					names = append(names, fmt.Sprintf("%s=%v", k, a.Content["name"]))
				}
				return content(text("answers: " + strings.Join(names, ", "))), nil
			},
		},
		guest.Tool{
			Name:        "confirm_delete",
			Description: "Asks the user to confirm deleting a file (nothing is deleted); may run as a task, which waits in input_required",
			InputSchema: `{"type":"object","properties":{"filename":{"type":"string"}},"required":["filename"]}`,
			TaskSupport: abi.TaskOptional,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				var in struct{ Filename string }
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				a, err := ask("confirm", fmt.Sprintf("Delete %s?", in.Filename), `{"type":"object","properties":{"confirm":{"type":"boolean"}},"required":["confirm"]}`)
				if err != nil {
					return nil, err
				}
				if ok, _ := a.Content["confirm"].(bool); ok {
					return content(text("deleted " + in.Filename)), nil
				}
				return content(text("kept " + in.Filename)), nil
			},
		},
	)
}

// computeRate is the loop iterations that take about a second on a
// compiled wazero guest (measured on a loaded 2-core machine, loosely).
const computeRate = 5_000_000

// sink keeps compute's loop from being optimised away.
var sink uint64

// compute spins for about seconds: a plugin has no clock unless the
// operator grants one, so it counts work instead. The host stops it at
// once when the call is cancelled or times out.
func compute(seconds float64) {
	x := sink
	for i := uint64(0); i < uint64(seconds*computeRate); i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink = x
}

// ask asks a form question; key names it in a 2026-07-28 client's
// inputRequests.
func ask(key, message, schema string) (*abi.ElicitResult, error) {
	res, err := guest.Elicit(abi.ElicitRequest{Message: message, RequestedSchema: json.RawMessage(schema), ElicitationID: key})
	if err != nil {
		return nil, fmt.Errorf("elicitation failed: %w", err)
	}
	if res.Action != abi.ActionAccept {
		return nil, fmt.Errorf("the user did not answer (%s)", res.Action)
	}
	return res, nil
}

// sample asks the client's model one question and returns its text reply.
func sample(prompt string, maxTokens int) (string, error) {
	res, err := guest.CreateMessage(map[string]any{
		"messages":  []guest.PromptMessage{{Role: "user", Content: guest.TextBlock(prompt)}},
		"maxTokens": maxTokens,
	})
	if err != nil {
		return "", fmt.Errorf("sampling failed: %w", err)
	}
	var tc abi.TextContent
	if json.Unmarshal(res.Content, &tc) == nil && tc.Type == "text" {
		return tc.Text, nil
	}
	return "(non-text response)", nil
}

const jsonSchema202012 = `{
	"$schema": "https://json-schema.org/draft/2020-12/schema",
	"type": "object",
	"$defs": {
		"address": {
			"$anchor": "addressDef",
			"type": "object",
			"properties": {
				"street": { "type": "string" },
				"city": { "type": "string" }
			}
		}
	},
	"properties": {
		"name": { "type": "string" },
		"address": { "$ref": "#/$defs/address" },
		"contactMethod": { "type": "string", "enum": ["phone", "email"] },
		"phone": { "type": "string" },
		"email": { "type": "string" }
	},
	"allOf": [
		{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }
	],
	"if": {
		"properties": { "contactMethod": { "const": "phone" } },
		"required": ["contactMethod"]
	},
	"then": { "required": ["phone"] },
	"else": { "required": ["email"] },
	"additionalProperties": false
}`
