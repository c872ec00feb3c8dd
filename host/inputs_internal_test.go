package host

import (
	"fmt"
	"strings"
	"testing"
)

// TestBatchQuestionRefuses: request_inputs' input is the guest's, checked
// before anything is asked.
func TestBatchQuestionRefuses(t *testing.T) {
	nine := make([]string, 9)
	for i := range nine {
		nine[i] = fmt.Sprintf(`"k%d":{"method":"roots/list"}`, i)
	}
	for _, tt := range []struct{ name, input, want string }{
		{"not JSON", `{`, "input must be"},
		{"not an object", `{"inputRequests":[1]}`, "input must be"},
		{"none", `{"inputRequests":{}}`, "no input requests"},
		{"too many", `{"inputRequests":{` + strings.Join(nine, ",") + `}}`, "9 input requests, over the limit of 8"},
		{"bad key", `{"inputRequests":{"a b":{"method":"roots/list"}}}`, `key "a b"`},
		{"comma in a key", `{"inputRequests":{"a,b":{"method":"roots/list"}}}`, `key "a,b"`},
		{"unknown method", `{"inputRequests":{"a":{"method":"tools/call","params":{}}}}`, "input must be"},
		{"nested form", `{"inputRequests":{"a":{"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object","properties":{"o":{"type":"object"}}}}}}}`, `input request "a"`},
		{"sampling without messages", `{"inputRequests":{"a":{"method":"sampling/createMessage","params":{"maxTokens":5}}}}`, "needs messages"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := batchQuestion([]byte(tt.input)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("batchQuestion(%s) = %v, want an error containing %q", tt.input, err, tt.want)
			}
		})
	}
	q, err := batchQuestion([]byte(`{"inputRequests":{"b":{"method":"roots/list"},"a":{"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object","properties":{"n":{"type":"string"}}}}}}}`))
	if err != nil || q.key != "a,b" || len(q.batch) != 2 || q.size(false) != 2 || q.size(true) != 1 {
		t.Errorf("a valid batch: %+v, %v", q, err)
	}
}
