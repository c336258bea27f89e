// What a backend reads for one packed forward (spec/model.md 1 and 4): per request its token ids
// and where the joint head looks (question and option spans, question types). Nothing of the
// protocol: question ids, option labels and the request's JSON stay above, in the engine's
// Prepared; protocol checks happen there, once. Image rows join here with the vision tower.
#pragma once
#include <clefrt/clefrt.h>

#include <cstdint>
#include <vector>

namespace clefrt::model {

struct SequenceMedia;  // model/forward.h

struct SeqQuestion {
  QuestionType type = QuestionType::Noul;
  Span question;              // the question's own tokens (its span mean is the question row)
  std::vector<Span> options;  // each option's tokens, encoded option order
};

struct Sequence {
  const int32_t* ids = nullptr;  // the request's token ids (not owned: they live in its Encoded)
  int64_t length = 0;
  // How many of the first ids a cached prefix may cover: the system prompt, STATE:, media and
  // state (Encoded::state_span.end); the schema and every span come after them.
  int64_t prefix_limit = 0;
  std::vector<SeqQuestion> questions;
  // Images: their positions and the vision tower's rows (not owned); null for text.
  const SequenceMedia* media = nullptr;
  // What the prefix cache matches, [length]: the ids, or the media's key_ids (images by their
  // bytes). A sequence with media but no key_ids is never cached (prefix_limit 0).
  const int32_t* key = nullptr;
  const int32_t* cache_key() const { return key ? key : ids; }
};

using Batch = std::vector<Sequence>;

// The backend's view of an encoded request (which must outlive it). A request with images needs
// their media (the tower's rows, engine_core.h image_media): without it, a 422.
Sequence sequence_of(const Encoded& e, const SequenceMedia* media = nullptr);
Batch batch_of(const std::vector<const Encoded*>& encoded);

}  // namespace clefrt::model
