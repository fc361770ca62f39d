package throttleextension

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHostileExplore(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	body, _ := e2eSignals[0].proto(1)
	paths := []string{"/v1/traces", "//v1/traces", "/v1/traces/", "/v1/./traces", "/v1/x/../traces", "/v1%2Ftraces", "/v1/%74races", "/V1/TRACES", "/v1/traces%2F", "/v1/traces#x", "/v1/traces?x=1", "/./v1/traces", "/../v1/traces", "http://" + env.httpAddr + "/v1/traces", "http://evil.example/v1/traces", "http://evil.example//v1/traces", "/" + strings.Repeat("/", 65536) + "v1/traces", "*", "v1/traces", "/v1//traces"}
	for _, lvl := range []struct{ l float64; s State }{{e2eCalm, StateNormal}, {e2eOpen, StateOpen}} {
		env.setLevel(t, lvl.l, lvl.s)
		for _, p := range paths {
			before := env.traces.SpanCount()
			c, err := net.Dial("tcp", env.httpAddr)
			require.NoError(t, err)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n%s", p, len(body), body)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Logf("%v %.40q: err %v", lvl.s, p, err)
				c.Close()
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			t.Logf("%v %.40q: %d loc=%q delivered=%d body=%.60q", lvl.s, p, resp.StatusCode, resp.Header.Get("Location"), env.traces.SpanCount()-before, b)
			c.Close()
		}
	}
}
