// What a backend reads for one packed forward (spec/model.md 1 and 4): per request its token ids
// and where the joint head looks (question and option spans, question types). Nothing of the
// protocol: question ids, option labels and the request's JSON stay above, in the engine's
// Prepared; protocol checks happen there, once. Image rows join here with the vision tower.
#pragma once
#include <clefrt/clefrt.h>

#include <cstdint>
#include <vector>

namespace clefrt::model {

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
};

using Batch = std::vector<Sequence>;

// The backend's view of encoded requests (which must outlive it). Throws a 422 for a request
// with images: no backend reads image rows yet.
Sequence sequence_of(const Encoded& e);
// The same view without that check, for the image path that brings the tower's rows itself (and
// its tests); the prefix cache must not see these until images are in its key.
Sequence sequence_with_media(const Encoded& e);
Batch batch_of(const std::vector<const Encoded*>& encoded);

}  // namespace clefrt::model
