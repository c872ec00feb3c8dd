package host_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// A session's standing GET whose connection the replica has not seen end
// (the replica was stopped past the proxy's read timeout: nginx closed
// the stream, and the client opened it again as soon as the replica was
// continued, before the replica read the close) must not make the
// client's new standing GET answered 409, which ends the session at the
// go-sdk client (the fault suite's sigstop-past-proxy behind nginx:
// session-lost, "Conflict"). The newer GET of the same stream is the
// client's: the older one is ended, and the newer served.
func TestNewStandingStreamEndsTheStaleOne(t *testing.T) {
	f := newReloadFixture(t, map[string][]byte{"counter.wasm": testplugins.Bytes(t, testplugins.Example(t, "counter"))})
	url := newEndsStreamsServer(t, f)
	session := rawSession(t, url)
	stale, endStale, err := openStanding(url, session, "")
	if err != nil {
		t.Fatal(err)
	}
	defer endStale()
	if stale.StatusCode != http.StatusOK {
		t.Fatalf("the first standing GET: %d", stale.StatusCode)
	}
	again, endAgain, err := openStanding(url, session, "")
	if err != nil {
		t.Fatal(err)
	}
	defer endAgain()
	if again.StatusCode != http.StatusOK {
		t.Fatalf("a standing GET of the session while an earlier one is open (its close not yet seen): HTTP %d; want 200, the earlier one ended (409 ends the session at the go-sdk client)", again.StatusCode)
	}
	ended := make(chan struct{})
	go func() {
		io.Copy(io.Discard, stale.Body)
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the earlier standing GET still open 10 s after the newer one was served")
	}
}
