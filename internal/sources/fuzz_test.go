package sources

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"
)

// FuzzLayer feeds a registry's untrusted bytes to the parsers that read
// them: a manifest or index (json, following no link: the index's child
// cannot be fetched) and a plugin tarball. Neither may panic, and the
// tarball parser returns at most max bytes.
func FuzzLayer(f *testing.F) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "plugin.wasm", Mode: 0o644, Size: 8, Typeflag: tar.TypeReg})
	tw.Write([]byte("\x00asm\x01\x00\x00\x00"))
	tw.Close()
	zw.Close()
	f.Add(buf.Bytes(), []byte(`{"schemaVersion":2,"layers":[{"mediaType":"application/wasm","size":8,"digest":"sha256:00"}]}`))
	f.Add([]byte{}, []byte(`{"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"platform":{"os":"wasip1"}}]}`))
	const max = 1 << 16
	f.Fuzz(func(t *testing.T, layer, manifest []byte) {
		for _, gz := range []bool{true, false} {
			if wasm, err := extractPlugin(layer, gz, max); err == nil && len(wasm) > max {
				t.Fatalf("%d bytes extracted, over %d", len(wasm), max)
			}
		}
		// A child manifest is fetched from a registry that is not there.
		repo, _ := remote.NewRepository("127.0.0.1:1/x")
		repo.PlainHTTP = true
		o := &ociFetch{spec: Spec{MaxSize: max}, repo: repo}
		if man, err := o.manifest(context.Background(), ocispec.MediaTypeImageManifest, manifest, 0); err == nil {
			pluginLayer(man)
		}
	})
}
