package asyncd_test

import (
	"encoding/json"
	"testing"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// The same vectors are in sdk/python/tests/test_idempotency.py: both SDKs must derive
// the same key for the same task.
func TestCanonicalJSON(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"b":1,"a":[true,false,null],"c":"x"}`, `{"a":[true,false,null],"b":1,"c":"x"}`},
		{`[42.0, -0, 1e3, 1.5e-7, 0.1, 123456789.5, 1e300, 12345678901234567890]`,
			`[42,0,1000,1.5e-07,1e-01,1.234567895e+08,1000000000000000052504760255204420248704468581108159154915854115511802457988908195786371375080447864043704443832883878176942523235360430575644792184786706982848387200926575803737830233794788090059368953234970799945081119038967640880074652742780142494579258788820056842838115669472196386865459400540160,12345678901234567890]`},
		{`"a\"b\\c\n\t\u0001\u001f/<>&é😀\u2028"`, `"a\"b\\c\n\t\u0001\u001f/<>&é😀` + "\u2028" + `"`},
		{`{"é":1,"z":2,"A":3,"😀":4,"ｚ":5}`, `{"A":3,"z":2,"é":1,"ｚ":5,"😀":4}`},
		{`{ }`, `{}`},
		{`[-2.5, 1e-5, 5e-324, 1e22, 0.30000000000000004]`, `[-2.5e+00,1e-05,5e-324,10000000000000000000000,3.0000000000000004e-01]`},
	}
	for _, c := range cases {
		got, err := asyncd.CanonicalJSON(json.RawMessage(c.in))
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if got != c.want {
			t.Errorf("canonical(%s)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

func TestIdempotencyKeyFrom(t *testing.T) {
	type order struct {
		OrderID  int     `json:"order_id"`
		Customer string  `json:"customer"`
		Amount   float64 `json:"amount"`
	}
	key := func(taskType string, payload any, fields ...string) string {
		t.Helper()
		k, err := asyncd.IdempotencyKeyFrom(taskType, payload, fields...)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a := key("cancel_expired_order", order{42, "ann", 9.5}, "order_id")
	if len(a) != 64 {
		t.Fatalf("key %q is not hex sha256", a)
	}
	// Fields not named do not matter; named ones and the type do.
	if b := key("cancel_expired_order", map[string]any{"order_id": 42.0, "customer": "bob"}, "order_id"); b != a {
		t.Errorf("other fields changed the key: %s != %s", b, a)
	}
	if b := key("cancel_expired_order", order{43, "ann", 9.5}, "order_id"); b == a {
		t.Error("order_id does not change the key")
	}
	if b := key("refund_order", order{42, "ann", 9.5}, "order_id"); b == a {
		t.Error("task type does not change the key")
	}
	// Field order does not matter.
	if key("t", order{42, "ann", 9.5}, "customer", "order_id") != key("t", order{42, "ann", 9.5}, "order_id", "customer") {
		t.Error("field order changed the key")
	}

	vectors := []struct {
		taskType, payload string
		fields            []string
		want              string
	}{
		{"cancel_expired_order", `{"order_id":42,"customer":"ann"}`, []string{"order_id"}, "4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec"},
		{"send_email", `{"to":"a@b.c","subject":"Grüße","n":1.5}`, nil, "57331f991c0efb748bd8e40a152f18cf790e31d13a90019a89571a5bb93315f6"},
		{"send_email", `{"to":"a@b.c","subject":"Grüße","n":1.5}`, []string{"to", "n"}, "506c0222380f9cad6b1ca8b019bc6ebadbb04ede3cc7caf3da21b21135d17b52"},
	}
	for _, v := range vectors {
		got := key(v.taskType, json.RawMessage(v.payload), v.fields...)
		if got != v.want {
			t.Errorf("IdempotencyKeyFrom(%s, %s, %v) = %s, want %s", v.taskType, v.payload, v.fields, got, v.want)
		}
	}

	if _, err := asyncd.IdempotencyKeyFrom("t", map[string]any{"a": 1}, "missing"); err == nil {
		t.Error("missing field accepted")
	}
	if _, err := asyncd.IdempotencyKeyFrom("t", []int{1}, "a"); err == nil {
		t.Error("fields on a non-object payload accepted")
	}
	if _, err := asyncd.IdempotencyKeyFrom("", 1); err == nil {
		t.Error("empty task type accepted")
	}
}
