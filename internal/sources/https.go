package sources

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// fetchHTTPS downloads a plugin's bytes, at most s.MaxSize of them.
func (m *Manager) fetchHTTPS(ctx context.Context, s Spec, u *url.URL) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "wasmtools")
	if c := s.Credential; c != nil {
		if c.Token != "" {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		} else {
			req.SetBasicAuth(c.Username, c.Password)
		}
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get: %s", resp.Status)
	}
	if resp.ContentLength > 0 && uint64(resp.ContentLength) > s.MaxSize {
		return nil, fmt.Errorf("%d bytes: %w (max_module_size = %d)", resp.ContentLength, ErrTooLarge, s.MaxSize)
	}
	pr := &progressReader{r: resp.Body, m: m, name: s.Name, total: resp.ContentLength, start: time.Now()}
	b, err := io.ReadAll(io.LimitReader(pr, int64(min(s.MaxSize, 1<<62))+1))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if uint64(len(b)) > s.MaxSize {
		return nil, fmt.Errorf("more than %d bytes: %w (max_module_size)", s.MaxSize, ErrTooLarge)
	}
	m.progress(Event{Name: s.Name, Stage: "done", Done: int64(len(b)), Total: int64(len(b)), Elapsed: time.Since(pr.start)})
	return b, nil
}
