// The dynamic metadata of an answer, as the reference's
// RESPONSE_DYNAMIC_METADATA writes it (src/service/ratelimit.go,
// ratelimitToMetadata, at f2fb157).

package rls

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata returns {domain, descriptors, hitsAddend, metadata} of
// req: hitsAddend when the request sets it, metadata (the rules' metadata
// of the descriptors passed, merged) when there is any.
func dynamicMetadata(req *pb.RateLimitRequest, ds []descriptor, passed []int) *structpb.Struct {
	descriptors := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		descriptors = append(descriptors, structpb.NewStructValue(descriptorStruct(d)))
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descriptors}),
	}
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, i := range passed {
		if m := ds[i].match; m != nil && m.Rule.Metadata != nil {
			merge(merged, m.Rule.Metadata)
		}
	}
	if len(merged.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

// descriptorStruct is a descriptor of the request as the metadata shows it:
// entries "key=value", its own limit (in the protobuf text form, as the
// reference's String), its own hits_addend.
func descriptorStruct(d *rlv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
	}
	fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		fields["limit"] = structpb.NewStringValue(l.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}

// merge adds src's fields to dst: a key dst has already keeps its value,
// but where both are maps, src's are merged into a copy of dst's. Rules'
// metadata is shared; it is never written.
func merge(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		switch {
		case !ok:
			dst.Fields[k] = v
		case have.GetStructValue() != nil && v.GetStructValue() != nil:
			into := &structpb.Struct{Fields: map[string]*structpb.Value{}}
			merge(into, have.GetStructValue())
			merge(into, v.GetStructValue())
			dst.Fields[k] = structpb.NewStructValue(into)
		}
	}
}
