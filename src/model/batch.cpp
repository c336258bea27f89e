#include "model/batch.h"

#include <algorithm>

#include "common/error.h"
#include "model/forward.h"

namespace clefrt::model {

Sequence sequence_of(const Encoded& e, const SequenceMedia* media) {
  if (!e.images.empty() && !media)
    throw Error(Status::Unprocessable, "unsupported", "images need the vision tower's rows: this request came without them", "images");
  Sequence s;
  s.media = e.images.empty() ? nullptr : media;
  s.ids = e.input_ids.data();
  s.length = int64_t(e.input_ids.size());
  // never past a span (the head reads those rows' hidden states) nor the last row
  int64_t limit = std::min<int64_t>(e.state_span.end, s.length - 1);
  for (const auto& q : e.questions) {
    limit = std::min<int64_t>(limit, q.question_span.begin);
    for (const Span& o : q.option_spans) limit = std::min<int64_t>(limit, o.begin);
  }
  const bool keyed = !s.media || s.media->key_ids.size() == size_t(s.length);
  s.key = s.media && keyed ? s.media->key_ids.data() : s.ids;
  s.prefix_limit = keyed ? std::max<int64_t>(limit, 0) : 0;
  s.questions.reserve(e.questions.size());
  for (const auto& q : e.questions) s.questions.push_back({q.type, q.question_span, q.option_spans});
  return s;
}

Batch batch_of(const std::vector<const Encoded*>& encoded) {
  Batch b;
  b.reserve(encoded.size());
  for (const Encoded* e : encoded) b.push_back(sequence_of(*e));
  return b;
}

}  // namespace clefrt::model
