package sources

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"oras.land/oras-go/v2/errdef"
)

// cosign's signature format (the "simple signing" format it attaches to an
// image as the tag sha256-HEX.sig): an image manifest whose layers are
// payloads, each signed in an annotation.
const (
	cosignPayloadType      = "application/vnd.dev.cosign.simplesigning.v1+json"
	cosignSigAnnotation    = "dev.cosignproject.cosign/signature"
	cosignSignatureType    = "cosign container image signature"
	maxSignaturePayload    = 64 << 10
	maxSignatureLayers     = 32
	maxSignatureAnnotation = 8 << 10
)

// cosignPayload is the part of a simple-signing payload that is checked:
// it must name the artifact's manifest digest.
type cosignPayload struct {
	Critical struct {
		Type  string `json:"type"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
	} `json:"critical"`
}

// PublicKey is a verifier loaded from a PEM file, with the name that
// errors and the status use for it.
type PublicKey struct {
	Path        string
	Fingerprint string // sha256 of the key's DER, first 16 hex digits
	verifier    signature.Verifier
}

// String names the key: its file and fingerprint.
func (k PublicKey) String() string {
	return fmt.Sprintf("key %s (sha256:%s)", k.Path, k.Fingerprint)
}

// LoadPublicKey reads a PEM public key (as `cosign generate-key-pair`
// writes cosign.pub): ECDSA, RSA or Ed25519, through sigstore's loaders.
func LoadPublicKey(path string) (PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key: %w", err)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(b)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key %s: %w", path, err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key %s: %w", path, err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key %s: %w", path, err)
	}
	sum := sha256.Sum256(der)
	return PublicKey{Path: path, Fingerprint: hex.EncodeToString(sum[:8]), verifier: v}, nil
}

// verify checks that a cosign signature of the resolved manifest verifies
// with one of the spec's keys, and returns what verified it. It runs
// before any layer is downloaded.
func (o *ociFetch) verify(ctx context.Context) (string, error) {
	if len(o.spec.PublicKeys) == 0 {
		return "", fmt.Errorf("%w: no public key configured (set public_key, or insecure_skip_signature = true to serve it unverified)", ErrSignature)
	}
	var keys []PublicKey
	var names []string
	for _, p := range o.spec.PublicKeys {
		k, err := LoadPublicKey(p)
		if err != nil {
			return "", err
		}
		keys = append(keys, k)
		names = append(names, k.String())
	}
	keyNames := strings.Join(names, ", ")
	d := o.desc.Digest.String()
	// cosign's two formats: the simple-signing manifest tagged
	// sha256-HEX.sig (cosign 2's default), and sigstore bundles attached
	// as OCI referrers (cosign 3's default, --new-bundle-format). Either
	// verifying is enough.
	tag := strings.Replace(d, ":", "-", 1) + ".sig"
	by, checked, reasons, sigErr := o.verifySigTag(ctx, keys, d, tag)
	if by != "" {
		return by, nil
	}
	bby, bchecked, breasons, bundleErr := o.verifyBundles(ctx, keys, d)
	if bby != "" {
		return bby, nil
	}
	checked += bchecked
	reasons = append(reasons, breasons...)
	if checked == 0 && len(reasons) == 0 {
		if sigErr != nil {
			return "", sigErr
		}
		if bundleErr != nil {
			return "", fmt.Errorf("signature bundles of %s: %w", d, bundleErr)
		}
		return "", fmt.Errorf("%w: %s has no cosign signature (no tag %s, no sigstore bundle among its referrers) to verify with %s", ErrSignature, d, tag, keyNames)
	}
	why := ""
	if len(reasons) > 0 {
		why = " (" + strings.Join(reasons, "; ") + ")"
	}
	return "", fmt.Errorf("%w: none of the %d signatures of %s verifies with %s%s", ErrSignature, checked, d, keyNames, why)
}

// verifySigTag checks the simple-signing signatures tagged tag. It
// returns what verified one, else how many were checked and why they
// failed; err is set when the tag could not be read (nil when absent).
func (o *ociFetch) verifySigTag(ctx context.Context, keys []PublicKey, d, tag string) (by string, checked int, reasons []string, err error) {
	sigDesc, err := o.repo.Resolve(ctx, tag)
	if errors.Is(err, errdef.ErrNotFound) {
		return "", 0, nil, nil
	}
	if err != nil {
		return "", 0, nil, fmt.Errorf("signature %s: %w", tag, err)
	}
	mb, err := o.fetchSmall(ctx, sigDesc, maxManifest)
	if err != nil {
		return "", 0, nil, fmt.Errorf("signature %s: %w", tag, err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(mb, &man); err != nil {
		return "", 0, nil, fmt.Errorf("signature %s: %w", tag, err)
	}
	for i, l := range man.Layers {
		if i >= maxSignatureLayers {
			break
		}
		sigB64 := l.Annotations[cosignSigAnnotation]
		if l.MediaType != cosignPayloadType || sigB64 == "" || len(sigB64) > maxSignatureAnnotation {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(sigB64)
		if err != nil {
			reasons = append(reasons, "a signature is not base64")
			continue
		}
		payload, err := o.fetchSmall(ctx, l, maxSignaturePayload)
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("payload: %v", err))
			continue
		}
		checked++
		for _, k := range keys {
			if k.verifier.VerifySignature(bytes.NewReader(sig), bytes.NewReader(payload)) != nil {
				continue
			}
			var p cosignPayload
			if err := json.Unmarshal(payload, &p); err != nil {
				reasons = append(reasons, fmt.Sprintf("a payload signed by %s does not parse: %v", k, err))
				continue
			}
			if p.Critical.Type != cosignSignatureType || p.Critical.Image.DockerManifestDigest != d {
				reasons = append(reasons, fmt.Sprintf("a payload signed by %s is for %q, not %s", k, p.Critical.Image.DockerManifestDigest, d))
				continue
			}
			return k.String(), checked, nil, nil
		}
	}
	return "", checked, reasons, nil
}
