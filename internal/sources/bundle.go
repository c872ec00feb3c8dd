package sources

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	sigdsse "github.com/sigstore/sigstore/pkg/signature/dsse"
	"oras.land/oras-go/v2/errdef"
)

// cosign 3's signature format (the default from cosign v3, and cosign 2
// with --new-bundle-format): a sigstore bundle (sigstore/protobuf-specs,
// bundle v0.3), attached to the signed manifest as an OCI referrer (the
// referrers API, or the tag sha256-HEX index where a registry has none).
// The bundle holds a DSSE envelope whose payload is an in-toto statement
// naming the manifest's digest, with cosign's signing predicate.
const (
	bundleMediaType       = "application/vnd.dev.sigstore.bundle.v0.3+json"
	bundleMediaTypeLegacy = "application/vnd.dev.sigstore.bundle+json;version=0.2"
	inTotoPayloadType     = "application/vnd.in-toto+json"
	inTotoStatementV1     = "https://in-toto.io/Statement/v1"
	cosignSignPredicate   = "https://sigstore.dev/cosign/sign/v1"
	maxBundle             = 64 << 10
	maxReferrers          = 32
)

// sigstoreBundle is the part of a bundle that key-based verification
// reads. A bundle with a certificate (keyless) or a message signature
// (blobs) is not one of cosign's image signatures by a key, and is
// reported as such.
type sigstoreBundle struct {
	MediaType            string `json:"mediaType"`
	VerificationMaterial struct {
		PublicKey   *struct{ Hint string } `json:"publicKey"`
		Certificate json.RawMessage        `json:"certificate"`
		X509Chain   json.RawMessage        `json:"x509CertificateChain"`
	} `json:"verificationMaterial"`
	DSSEEnvelope     json.RawMessage `json:"dsseEnvelope"`
	MessageSignature json.RawMessage `json:"messageSignature"`
}

// inTotoStatement is the part of the signed statement that is checked.
type inTotoStatement struct {
	Type    string `json:"_type"`
	Subject []struct {
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	PredicateType string `json:"predicateType"`
}

// verifyBundles checks the sigstore bundles among the referrers of the
// resolved manifest d with keys, as verifySigTag does the .sig tag: what
// verified one, else how many were checked and why they failed. As for
// the .sig format, no transparency log entry is required or checked.
func (o *ociFetch) verifyBundles(ctx context.Context, keys []PublicKey, d string) (by string, checked int, reasons []string, err error) {
	var refs []ocispec.Descriptor
	err = o.repo.Referrers(ctx, o.desc, "", func(page []ocispec.Descriptor) error {
		refs = append(refs, page...)
		if len(refs) > maxReferrers {
			refs = refs[:maxReferrers]
			return errStopReferrers
		}
		return nil
	})
	if errors.Is(err, errStopReferrers) || errors.Is(err, errdef.ErrNotFound) {
		err = nil
	}
	if err != nil {
		return "", 0, nil, err
	}
	want := strings.TrimPrefix(d, "sha256:")
	tried := 0
	for _, r := range refs {
		if r.MediaType != ocispec.MediaTypeImageManifest {
			continue
		}
		mb, err := o.fetchSmall(ctx, r, maxManifest)
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("referrer %s: %v", r.Digest, err))
			continue
		}
		var man ocispec.Manifest
		if err := json.Unmarshal(mb, &man); err != nil || man.Subject == nil || man.Subject.Digest.String() != d {
			continue // not a referrer of d
		}
		if man.ArtifactType != bundleMediaType && man.ArtifactType != bundleMediaTypeLegacy {
			continue // another kind of referrer (an SBOM, an attestation)
		}
		for _, l := range man.Layers {
			if l.MediaType != bundleMediaType && l.MediaType != bundleMediaTypeLegacy {
				continue
			}
			// As many bundles in all as .sig payloads: a referrer may
			// list thousands, each a read and a verification.
			if tried++; tried > maxSignatureLayers {
				reasons = append(reasons, fmt.Sprintf("more than %d bundles: the rest not read", maxSignatureLayers))
				return "", checked, reasons, nil
			}
			b, err := o.fetchSmall(ctx, l, maxBundle)
			if err != nil {
				reasons = append(reasons, fmt.Sprintf("bundle %s: %v", l.Digest, err))
				continue
			}
			checked++
			k, why := verifyBundle(b, keys, want)
			if why == "" {
				return k.String() + " (sigstore bundle)", checked, nil, nil
			}
			reasons = append(reasons, why)
		}
	}
	return "", checked, reasons, nil
}

var errStopReferrers = errors.New("enough referrers")

// verifyBundle verifies one bundle's DSSE envelope with each key (through
// sigstore's DSSE verifier, over the envelope's pre-authentication
// encoding) and checks its statement names manifest digest want (hex).
// It returns the key that verified it, or why none did.
func verifyBundle(b []byte, keys []PublicKey, want string) (PublicKey, string) {
	var bd sigstoreBundle
	if err := json.Unmarshal(b, &bd); err != nil {
		return PublicKey{}, fmt.Sprintf("a bundle does not parse: %v", err)
	}
	if bd.VerificationMaterial.Certificate != nil || bd.VerificationMaterial.X509Chain != nil {
		return PublicKey{}, "a bundle is keyless (a certificate), which is not supported: give its signer's public key"
	}
	if bd.DSSEEnvelope == nil {
		return PublicKey{}, "a bundle has no DSSE envelope (not a cosign image signature)"
	}
	var signed []string
	for _, k := range keys {
		var payload []byte
		v := sigdsse.WrapVerifier(k.verifier, sigdsse.WithExpectedPayloadType(inTotoPayloadType), sigdsse.WithDecodedPayload(&payload))
		if v.VerifySignature(bytes.NewReader(bd.DSSEEnvelope), nil) != nil {
			continue
		}
		var st inTotoStatement
		if err := json.Unmarshal(payload, &st); err != nil {
			return PublicKey{}, fmt.Sprintf("a statement signed by %s does not parse: %v", k, err)
		}
		if st.Type != inTotoStatementV1 || st.PredicateType != cosignSignPredicate {
			return PublicKey{}, fmt.Sprintf("a statement signed by %s is %q with predicate %q, not cosign's image signature", k, st.Type, st.PredicateType)
		}
		for _, s := range st.Subject {
			if got := s.Digest["sha256"]; got != "" {
				if _, err := hex.DecodeString(got); err == nil && got == want {
					return k, ""
				}
				signed = append(signed, "sha256:"+got)
			}
		}
		return PublicKey{}, fmt.Sprintf("a statement signed by %s is for %v, not sha256:%s", k, signed, want)
	}
	return PublicKey{}, "a bundle is signed by none of the keys"
}
