package parameters

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzDecode checks that no input makes Decode panic (it runs in /init on
// bytes anyone with access to the ESP or the boot menu can supply), and that
// whatever Decode accepts survives Encode and Decode unchanged, so that
// plinthctl and the node always agree on what a document says.
func FuzzDecode(f *testing.F) {
	f.Add(mustMarshal(f, bootstrapDoc()))
	f.Add(mustMarshal(f, registerDoc(f)))
	f.Add([]byte("\x0a\x22garbage that starts like a bootstrap field"))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := Decode(raw)
		if err != nil {
			if p != nil {
				t.Fatal("Decode returned a document with an error")
			}
			return
		}
		enc, err := Encode(p)
		if err != nil {
			t.Fatalf("Decode accepted what Encode refuses: %v", err)
		}
		q, err := Decode(enc)
		if err != nil {
			t.Fatalf("re-encoded document does not decode: %v", err)
		}
		if !proto.Equal(p, q) {
			t.Fatalf("round trip changed the document:\n got %v\nwant %v", q, p)
		}
		// Encoding is canonical after one round: /init measures these bytes.
		if enc2, _ := Encode(q); string(enc2) != string(enc) {
			t.Fatal("encoding is not stable")
		}
	})
}
